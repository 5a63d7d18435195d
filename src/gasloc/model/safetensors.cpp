#include "gasloc/model/safetensors.hpp"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <set>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::model {
namespace fs = std::filesystem;
using json = nlohmann::json;

// The format is little-endian; raw tensor memory is copied as is.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; a larger length is corruption.
constexpr uint64_t kMaxHeader = 100'000'000;

struct DtypeName {
  const char* name;
  torch::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16}, {"I64", torch::kInt64}, {"I32", torch::kInt32},
    {"I16", torch::kInt16},   {"I8", torch::kInt8},     {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
};

[[noreturn]] void fail(const fs::path& path, const std::string& problem) {
  throw CheckpointError("safetensors file '" + path.string() + "': " + problem,
                        "the file is corrupt or not a safetensors file; re-export or re-download it");
}

struct Entry {
  std::string name;
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// Parses and checks one header entry; `data_size` is the length of the data section.
Entry parse_entry(const fs::path& path, const std::string& name, const json& j, uint64_t data_size) {
  auto bad = [&](const std::string& what) { fail(path, "tensor '" + name + "': " + what); };
  if (!j.is_object()) bad("header entry is not an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      bad("unexpected header field '" + it.key() + "'");
  if (!j.contains("dtype") || !j["dtype"].is_string()) bad("missing or non-string 'dtype'");
  if (!j.contains("shape") || !j["shape"].is_array()) bad("missing or non-array 'shape'");
  const auto& offs = j.contains("data_offsets") ? j["data_offsets"] : json();
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
    bad("'data_offsets' must be two non-negative integers");

  Entry e;
  e.name = name;
  const std::string dt = j["dtype"].get<std::string>();
  const auto* d = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& x) { return dt == x.name; });
  if (d == std::end(kDtypes)) bad("unknown or unsupported dtype '" + dt + "'");
  e.type = d->type;

  uint64_t bytes = torch::elementSize(e.type);
  for (const auto& s : j["shape"]) {
    if (!s.is_number_unsigned()) bad("shape " + j["shape"].dump() + " has a non-integer or negative entry");
    const uint64_t v = s.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, v, &bytes))
      bad("shape " + j["shape"].dump() + " is too large");
    e.shape.push_back(static_cast<int64_t>(v));
  }
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size)
    bad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
        "] out of range of the data section (" + std::to_string(data_size) + " bytes)");
  if (e.end - e.begin != bytes)
    bad("data_offsets span " + std::to_string(e.end - e.begin) + " bytes but dtype " + dt + " and shape " +
        j["shape"].dump() + " need " + std::to_string(bytes));
  return e;
}

}  // namespace

void save_safetensors(const fs::path& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> order;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || name.empty())
      throw CheckpointError("cannot write '" + path.string() + "': tensor name '" + name + "' is reserved");
    if (!seen.insert(name).second)
      throw CheckpointError("cannot write '" + path.string() + "': duplicate tensor name '" + name + "'");
    // The bytes to write: dense, CPU, no autograd history.
    order.emplace_back(name, t.detach().to(torch::kCPU).contiguous());
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.element_size() > b.second.element_size(); });

  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    const auto* d = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                 [&](const DtypeName& x) { return x.type == t.scalar_type(); });
    if (d == std::end(kDtypes))
      throw CheckpointError("cannot write '" + path.string() + "': tensor '" + name + "' has unsupported dtype " +
                            std::string(c10::toString(t.scalar_type())));
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", d->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out;
  out.reserve(8 + head.size() + offset);
  const uint64_t n = head.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += head;
  for (const auto& [name, t] : order)
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  write_file_atomic(path, out);
}

std::map<std::string, torch::Tensor> load_safetensors(const fs::path& path, std::map<std::string, std::string>* metadata) {
  // Streamed rather than read whole: each tensor's bytes go straight into its storage, so a
  // multi-GB file needs its size in memory once, not twice.
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CheckpointError("cannot open safetensors file '" + path.string() + "'",
                          "check the path; export writes DIR/model.safetensors");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot get its size: " + ec.message());
  if (size < 8) fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > size - 8)
    fail(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) + " bytes)");
  if (n > kMaxHeader) fail(path, "header length " + std::to_string(n) + " is above the 100 MB limit");
  std::string head(n, '\0');
  if (!in.read(head.data(), static_cast<std::streamsize>(n))) fail(path, "read error in the header");

  json header;
  try {
    header = json::parse(head);
  } catch (const json::parse_error& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  const uint64_t data_size = size - 8 - n;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail(path, "'__metadata__' is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail(path, "metadata value of '" + m.key() + "' is not a string");
        if (metadata) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, it.key(), *it, data_size));
  }

  // Tensors must tile the data section exactly, as the reference implementation requires.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  for (const Entry* e : by_offset) {
    if (e->begin < covered) fail(path, "tensor '" + e->name + "' overlaps the previous tensor's data");
    if (e->begin > covered)
      fail(path, "bytes " + std::to_string(covered) + ".." + std::to_string(e->begin) + " of the data belong to no tensor");
    covered = e->end;
  }
  if (covered != data_size)
    fail(path, std::to_string(data_size - covered) + " trailing bytes belong to no tensor");

  std::map<std::string, torch::Tensor> out;
  for (const Entry* e : by_offset) {
    // BOOL is read as bytes first: a byte other than 0/1 in a bool tensor is undefined behaviour.
    const auto type = e->type == torch::kBool ? torch::kUInt8 : e->type;
    torch::Tensor t = torch::empty(e->shape, torch::TensorOptions().dtype(type));
    const auto bytes = static_cast<std::streamsize>(e->end - e->begin);
    in.seekg(static_cast<std::streamoff>(8 + n + e->begin));
    if (bytes > 0 && !in.read(static_cast<char*>(t.data_ptr()), bytes))
      fail(path, "read error in the data of tensor '" + e->name + "'");
    out.emplace(e->name, e->type == torch::kBool ? t.ne(0) : t);
  }
  return out;
}

}  // namespace gasloc::model
