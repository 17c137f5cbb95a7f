#include "training/state_dict.h"

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>

namespace examples {

namespace {

// What the unpickler builds: a value of one of the kinds a state_dict's pickle holds. Dicts and
// lists are shared, as the memo refers to them.
struct Value;
using Ref = std::shared_ptr<Value>;
struct Value {
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Storage, Tensor };
  Kind kind = Kind::None;
  int64_t i = 0;
  double f = 0;
  std::string s;                           // String; Global: "module.name"; Storage: its key
  std::vector<Ref> items;                  // Tuple, List
  std::vector<std::pair<Ref, Ref>> pairs;  // Dict
  at::ScalarType dtype = at::kFloat;       // Storage
  at::Tensor tensor;                       // Tensor
};

Ref make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

class Unpickler {
 public:
  Unpickler(const std::string& path, caffe2::serialize::PyTorchStreamReader& archive,
            std::string pickle)
      : path_(path), archive_(archive), pickle_(std::move(pickle)) {}

  Ref run() {
    while (true) {
      const auto op = static_cast<uint8_t>(byte());
      switch (op) {
        case 0x80: byte(); break;    // PROTO
        case 0x95: bytes(8); break;  // FRAME
        case '(': marks_.push_back(stack_.size()); break;
        case '.': return pop();                      // STOP
        case '0': pop(); break;                      // POP
        case '1': stack_.resize(takeMark()); break;  // POP_MARK
        case '2': stack_.push_back(stack_.back()); break;
        case 'N': stack_.push_back(make(Value::Kind::None)); break;
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          Ref v = make(Value::Kind::Bool);
          v->i = op == 0x88;
          stack_.push_back(v);
          break;
        }
        case 'J': pushInt(static_cast<int32_t>(little(4))); break;
        case 'K': pushInt(static_cast<int64_t>(little(1))); break;
        case 'M': pushInt(static_cast<int64_t>(little(2))); break;
        case 0x8a: {  // LONG1
          const size_t n = static_cast<size_t>(little(1));
          uint64_t raw = little(n);
          if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);
          pushInt(static_cast<int64_t>(raw));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          uint64_t raw = 0;
          for (char c : bytes(8)) raw = (raw << 8) | static_cast<uint8_t>(c);
          Ref v = make(Value::Kind::Float);
          std::memcpy(&v->f, &raw, 8);
          stack_.push_back(v);
          break;
        }
        case 'X': pushString(bytes(little(4))); break;   // BINUNICODE
        case 0x8c: pushString(bytes(little(1))); break;  // SHORT_BINUNICODE
        case 0x8d: pushString(bytes(little(8))); break;  // BINUNICODE8
        case 'B': pushString(bytes(little(4))); break;   // BINBYTES
        case 'C': pushString(bytes(little(1))); break;   // SHORT_BINBYTES
        case 'c': {                                      // GLOBAL
          std::string module = line(), name = line();
          pushGlobal(module + "." + name);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Ref name = pop(), module = pop();
          pushGlobal(module->s + "." + name->s);
          break;
        }
        case 'q': memo_[little(1)] = stack_.back(); break;      // BINPUT
        case 'r': memo_[little(4)] = stack_.back(); break;      // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = stack_.back(); break;  // MEMOIZE
        case 'h': stack_.push_back(memo(little(1))); break;     // BINGET
        case 'j': stack_.push_back(memo(little(4))); break;     // LONG_BINGET
        case ')': stack_.push_back(make(Value::Kind::Tuple)); break;
        case 0x85:
        case 0x86:
        case 0x87: tuple(op - 0x84); break;
        case 't': tuple(stack_.size() - takeMark()); break;
        case ']': stack_.push_back(make(Value::Kind::List)); break;
        case 'a': {  // APPEND
          Ref v = pop();
          stack_.back()->items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          const size_t from = takeMark();
          Ref list = stack_[from - 1];
          list->items.insert(list->items.end(), stack_.begin() + static_cast<long>(from),
                             stack_.end());
          stack_.resize(from);
          break;
        }
        case '}': stack_.push_back(make(Value::Kind::Dict)); break;
        case 's': {  // SETITEM
          Ref v = pop(), k = pop();
          stack_.back()->pairs.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          const size_t from = takeMark();
          Ref dict = stack_[from - 1];
          for (size_t j = from; j + 1 < stack_.size(); j += 2) {
            dict->pairs.emplace_back(stack_[j], stack_[j + 1]);
          }
          stack_.resize(from);
          break;
        }
        case 'Q': stack_.push_back(persistent(pop())); break;  // BINPERSID
        case 'R': {                                            // REDUCE
          Ref args = pop(), callable = pop();
          stack_.push_back(reduce(*callable, *args));
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
          pop();
          fail("it holds an object of " + pop()->s);
        }
        case 'b': pop(); break;  // BUILD: a state_dict's _metadata; the tensors need none
        default:
          fail(fmt::format("pickle opcode 0x{:02x} at byte {}, which a state_dict of tensors "
                           "does not use",
                           op, at_ - 1));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(fmt::format("{}: {}. HINT: save the model's state_dict itself "
                                         "(torch.save(model.state_dict(), path))",
                                         path_, what));
  }

  char byte() {
    if (at_ >= pickle_.size()) fail("its pickle ends early");
    return pickle_[at_++];
  }
  std::string bytes(uint64_t n) {
    if (n > pickle_.size() - at_) fail("its pickle ends early");
    std::string out = pickle_.substr(at_, n);
    at_ += n;
    return out;
  }
  uint64_t little(size_t n) {
    uint64_t v = 0;
    const std::string b = bytes(n);
    for (size_t k = 0; k < n; ++k) v |= uint64_t{static_cast<uint8_t>(b[k])} << (8 * k);
    return v;
  }
  std::string line() {
    const size_t end = pickle_.find('\n', at_);
    if (end == std::string::npos) fail("its pickle ends early");
    std::string out = pickle_.substr(at_, end - at_);
    at_ = end + 1;
    return out;
  }
  Ref pop() {
    if (stack_.empty()) fail("its pickle pops an empty stack");
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t takeMark() {
    if (marks_.empty()) fail("its pickle has no mark where one is needed");
    const size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  Ref memo(uint64_t k) const {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail(fmt::format("its pickle reads memo {} before writing it", k));
    return it->second;
  }
  void pushInt(int64_t i) {
    Ref v = make(Value::Kind::Int);
    v->i = i;
    stack_.push_back(v);
  }
  void pushString(std::string s) {
    Ref v = make(Value::Kind::String);
    v->s = std::move(s);
    stack_.push_back(v);
  }
  void pushGlobal(std::string name) {
    Ref v = make(Value::Kind::Global);
    v->s = std::move(name);
    stack_.push_back(v);
  }
  void tuple(size_t n) {
    if (n > stack_.size()) fail("its pickle makes a tuple of more than the stack holds");
    Ref t = make(Value::Kind::Tuple);
    t->items.assign(stack_.end() - static_cast<long>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    stack_.push_back(t);
  }

  // ('storage', torch.<Type>Storage, key, location, numel): the record data/<key>.
  Ref persistent(const Ref& id) {
    static const std::map<std::string, at::ScalarType> kTypes = {
        {"FloatStorage", at::kFloat}, {"DoubleStorage", at::kDouble},
        {"HalfStorage", at::kHalf},   {"BFloat16Storage", at::kBFloat16},
        {"LongStorage", at::kLong},   {"IntStorage", at::kInt},
        {"ShortStorage", at::kShort}, {"CharStorage", at::kChar},
        {"ByteStorage", at::kByte},   {"BoolStorage", at::kBool}};
    if (id->kind != Value::Kind::Tuple || id->items.size() < 3 || id->items[0]->s != "storage" ||
        id->items[1]->kind != Value::Kind::Global) {
      fail("a persistent object that is not a storage");
    }
    const std::string& type = id->items[1]->s;
    const std::string name = type.substr(type.rfind('.') + 1);
    auto it = kTypes.find(name);
    if (it == kTypes.end()) fail("a storage of type " + type);
    Ref v = make(Value::Kind::Storage);
    v->dtype = it->second;
    v->s = id->items[2]->s;
    return v;
  }

  at::Tensor storage(const Value& s) {
    auto it = storages_.find(s.s);
    if (it != storages_.end()) return it->second;
    const std::string record = "data/" + s.s;
    if (!archive_.hasRecord(record)) fail("its storage " + record + " is missing");
    // Read straight into the tensor: a record read into a buffer of its own and copied would
    // hold each storage twice for a moment (the largest one beside the whole state_dict).
    const size_t size = archive_.getRecordSize(record);
    const size_t elem = c10::elementSize(s.dtype);
    at::Tensor t = at::empty({static_cast<int64_t>(size / elem)}, at::TensorOptions(s.dtype));
    if (size > 0) archive_.getRecord(record, t.data_ptr(), size);
    storages_[s.s] = t;
    return t;
  }

  std::vector<int64_t> ints(const Value& t) const {
    std::vector<int64_t> out;
    for (const Ref& v : t.items) out.push_back(v->i);
    return out;
  }

  Ref reduce(const Value& callable, const Value& args) {
    const std::string& f = callable.s;
    const auto& a = args.items;
    if (f == "collections.OrderedDict" || f == "builtins.dict") return make(Value::Kind::Dict);
    if ((f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") &&
        a.size() >= 4 && a[0]->kind == Value::Kind::Storage) {
      Ref v = make(Value::Kind::Tensor);
      const at::Tensor whole = storage(*a[0]);
      at::Tensor view = whole.as_strided(ints(*a[2]), ints(*a[3]), a[1]->i);
      // A tensor that is its whole storage (a parameter saved alone: the usual case) is that
      // storage, not a copy, so the state_dict is held once; a view of part of a storage (or
      // of one shared with another tensor) gets memory of its own.
      const bool alone = a[1]->i == 0 && view.is_contiguous() && view.numel() == whole.numel();
      v->tensor = alone ? view : view.clone();
      return v;
    }
    if ((f == "torch._utils._rebuild_parameter" ||
         f == "torch._utils._rebuild_parameter_with_state") &&
        !a.empty()) {
      return a[0];
    }
    // copyreg's reconstructor and __newobj__ name the class they make first.
    const bool maker = f == "copyreg._reconstructor" || f == "copyreg.__newobj__";
    const std::string what = maker && !a.empty() ? a[0]->s : f;
    fail("it holds an object of " + (what.empty() ? std::string("an unknown class") : what));
  }

  const std::string& path_;
  caffe2::serialize::PyTorchStreamReader& archive_;
  const std::string pickle_;
  size_t at_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Ref> memo_;
  std::map<std::string, at::Tensor> storages_;
};

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> readStateDict(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: not an archive torch.save writes ({}). HINT: "
                                         "torch.save(model.state_dict(), path) in PyTorch 1.6 "
                                         "or later",
                                         path, std::string(e.what()).substr(0, 200)));
  }
  if (archive->hasRecord("byteorder")) {
    auto [data, size] = archive->getRecord("byteorder");
    const std::string order(static_cast<const char*>(data.get()), size);
    if (order != "little") {
      throw std::runtime_error(
          fmt::format("{}: saved {}-endian; this reads little-endian", path, order));
    }
  }
  std::string pickle;
  {
    auto [data, size] = archive->getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(data.get()), size);
  }  // the record's buffer goes before the storages are read: the unpickler reads its own copy
  Unpickler unpickler(path, *archive, std::move(pickle));
  const Ref root = unpickler.run();
  if (root->kind != Value::Kind::Dict) {
    throw std::runtime_error(fmt::format("{}: it holds no dict of tensors. HINT: save the "
                                         "model's state_dict itself",
                                         path));
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [k, v] : root->pairs) {
    if (k->kind != Value::Kind::String || v->kind != Value::Kind::Tensor) {
      throw std::runtime_error(fmt::format(
          "{}: its entry {} is not a tensor under a name (a checkpoint of several things?). "
          "HINT: save the model's state_dict itself, or torch.save(checkpoint[\"model\"], path)",
          path, k->kind == Value::Kind::String ? k->s : "?"));
    }
    out.emplace_back(k->s, v->tensor);
  }
  return out;
}

}  // namespace examples
