// Precompiled header of the torch layer and of the torch tests (never included by hand).
#include <torch/torch.h>
