#include "gasloc/data/spm_runtime.hpp"

#include <dlfcn.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <mutex>
#include <new>

#include "gasloc/core/error.hpp"

namespace gasloc::data::spm {
namespace sp = sentencepiece;
using sp::util::Status;

namespace {

// Entry points found with dlsym. Non-static members are called as plain functions taking
// `this` first (the Itanium C++ ABI), only for ones returning void or a pointer. Classes are
// used through the header's layout and vtables, which match the library because Debian ships
// both from one source package (0.1.97). After changing this file, check that
// `nm -u libgasloc_data.a | c++filt | grep sentencepiece::` prints nothing: a link-time
// reference would bring the library (and the crash) back.
struct Lib {
  void (*processor_ctor)(void*) = nullptr;
  void (*status_dtor)(Status*) = nullptr;
  const char* (*status_message)(const Status*) = nullptr;
  Status (*train)(const std::unordered_map<std::string, std::string>&, sp::SentenceIterator*, std::string*) = nullptr;
  void (*set_seed)(unsigned) = nullptr;
  void (*set_min_log_level)(int) = nullptr;
};

template <class F>
void bind(void* handle, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!fn)
    throw DataError(std::string("SentencePiece library lacks symbol ") + name,
                    "install libsentencepiece0 0.1.9x (Debian: apt-get install libsentencepiece0), or use --byte-level");
}

const Lib& lib() {
  static Lib l;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    if (failure = unavailable_reason(); !failure.empty()) return;
    // The training library pulls in libsentencepiece itself into the same private scope.
    void* h = nullptr;
    for (const char* name : {"libsentencepiece_train.so.0", "libsentencepiece_train.so"})
      if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND))) break;
    if (!h) {
      failure = std::string("cannot load the SentencePiece library: ") + dlerror();
      return;
    }
    try {
      bind(h, "_ZN13sentencepiece22SentencePieceProcessorC1Ev", l.processor_ctor);
      bind(h, "_ZN13sentencepiece4util6StatusD1Ev", l.status_dtor);
      bind(h, "_ZNK13sentencepiece4util6Status13error_messageEv", l.status_message);
      bind(h,
           "_ZN13sentencepiece20SentencePieceTrainer5TrainERKSt13unordered_mapINSt7__cxx1112basic_stringIcSt11char_"
           "traitsIcESaIcEEES7_St4hashIS7_ESt8equal_toIS7_ESaISt4pairIKS7_S7_EEEPNS_16SentenceIteratorEPS7_",
           l.train);
      bind(h, "_ZN13sentencepiece22SetRandomGeneratorSeedEj", l.set_seed);
      bind(h, "_ZN13sentencepiece7logging14SetMinLogLevelEi", l.set_min_log_level);
    } catch (const DataError& e) {
      failure = e.what();
      return;
    }
    // Nothing may print: under RTLD_DEEPBIND the library would write to libstdc++'s own
    // std::cerr, not the program's copy. Errors reach us as Status values instead.
    l.set_min_log_level(4);
  });
  if (!failure.empty())
    throw DataError(failure, unavailable_reason().empty()
                                 ? "install libsentencepiece0 (Debian/Ubuntu: apt-get install libsentencepiece0), or use "
                                   "--byte-level"
                                 : "use a build without GASLOC_SANITIZE=address for SentencePiece, or --byte-level");
  return l;
}

// Holds a Status returned by value from the library. Constructing it from the call's prvalue
// is guaranteed copy elision, so no Status constructor is referenced; the destructor is the
// library's, called through its pointer.
class StatusBox {
 public:
  template <class Call>
  explicit StatusBox(Call&& call) { ::new (buf_) Status(call()); }
  ~StatusBox() { lib().status_dtor(get()); }
  StatusBox(const StatusBox&) = delete;
  StatusBox& operator=(const StatusBox&) = delete;
  bool ok() const { return get()->ok(); }
  std::string message() const {
    const char* m = lib().status_message(get());
    return m ? m : "unknown error";
  }

 private:
  Status* get() const { return std::launder(reinterpret_cast<Status*>(const_cast<unsigned char*>(buf_))); }
  alignas(Status) unsigned char buf_[sizeof(Status)];
};

void destroy(sp::SentencePieceProcessor* p) { delete p; }  // virtual: runs the library's destructor

}  // namespace

std::string unavailable_reason() {
#if defined(__SANITIZE_ADDRESS__)
  // ASan's dlopen() would abort the process on RTLD_DEEPBIND (google/sanitizers#611): the
  // library's own calls to malloc and friends would bypass ASan's. Without RTLD_DEEPBIND its
  // protobuf would clash with LibTorch's (spm_runtime.hpp), so an ASan build goes without.
  return "SentencePiece cannot be loaded in an AddressSanitizer build (ASan refuses the RTLD_DEEPBIND it needs)";
#else
  return {};
#endif
}

Processor::Processor(const std::string& model_bytes, const std::string& source) {
  const Lib& l = lib();
  void* mem = ::operator new(sizeof(sp::SentencePieceProcessor));
  l.processor_ctor(mem);
  std::shared_ptr<sp::SentencePieceProcessor> p(std::launder(static_cast<sp::SentencePieceProcessor*>(mem)), destroy);
  StatusBox st([&] { return p->LoadFromSerializedProto(model_bytes); });
  if (!st.ok())
    throw DataError("cannot load SentencePiece model '" + source + "': " + st.message(),
                    "the file is not a SentencePiece .model (a Hugging Face tokenizer.json is not supported)");
  p_ = std::move(p);
}

// The header's convenience wrappers (EncodeAsIds, DecodeIds) are inline and would be
// speculatively devirtualized into direct calls; only out-of-line virtuals are used here.
std::vector<int> Processor::encode(std::string_view text) const {
  std::vector<int> ids;
  StatusBox st([&] { return p_->Encode(text, &ids); });
  if (!st.ok()) throw DataError("SentencePiece cannot encode text: " + st.message(), "check the tokenizer model");
  return ids;
}

std::string Processor::decode(const std::vector<int>& ids) const {
  std::string text;
  StatusBox st([&] { return p_->Decode(ids, &text); });
  if (!st.ok()) throw DataError("SentencePiece cannot decode ids: " + st.message(), "check the tokenizer model");
  return text;
}

int Processor::piece_size() const { return p_->GetPieceSize(); }
int Processor::bos_id() const { return p_->bos_id(); }
int Processor::eos_id() const { return p_->eos_id(); }
int Processor::unk_id() const { return p_->unk_id(); }
std::string Processor::piece(int id) const { return p_->IdToPiece(id); }

bool train(const std::unordered_map<std::string, std::string>& args, unsigned seed, std::string* model,
           std::string* error) {
  const Lib& l = lib();
  // The generator and the log level are process-wide state of the library.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  l.set_seed(seed);
  StatusBox st([&] { return l.train(args, nullptr, model); });
  if (!st.ok()) *error = st.message();
  return st.ok();
}

}  // namespace gasloc::data::spm
