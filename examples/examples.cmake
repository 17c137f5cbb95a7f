# Sample trainers a new user copies to start.
include(examples/samples.cmake OPTIONAL)
