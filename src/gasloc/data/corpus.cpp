#include "gasloc/data/corpus.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/sha256.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// JSONL: a blank line is tolerated (trailing newlines are common), anything else must be an
// object holding a string in `field`.
void read_jsonl(const fs::path& path, const std::string& text, const std::string& field, std::vector<std::string>& docs) {
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (blank(line)) continue;
    auto where = [&] { return fmt::format("'{}' line {}", path.string(), line_no); };
    json obj;
    try {
      obj = json::parse(line);
    } catch (const json::parse_error& e) {
      throw DataError(where() + " is not valid JSON: " + e.what(),
                      "a .jsonl file needs one JSON object per line; fix or remove that line");
    }
    if (!obj.is_object() || !obj.contains(field))
      throw DataError(where() + " has no field \"" + field + "\"",
                      "pass --text-field NAME with the field that holds the document text");
    if (!obj[field].is_string())
      throw DataError(where() + ": field \"" + field + "\" is " + obj[field].type_name() + ", not a string",
                      "pass --text-field NAME with the field that holds the document text");
    auto s = obj[field].get<std::string>();
    if (!s.empty()) docs.push_back(std::move(s));
  }
}

void read_json(const fs::path& path, const std::string& text, const std::string& field, std::vector<std::string>& docs) {
  json arr;
  try {
    arr = json::parse(text);
  } catch (const json::parse_error& e) {
    throw DataError("'" + path.string() + "' is not valid JSON: " + e.what(),
                    "a .json input must be an array of strings or of objects; use .jsonl for one object per line");
  }
  if (!arr.is_array())
    throw DataError("'" + path.string() + "' holds a JSON " + std::string(arr.type_name()) + ", not an array",
                    "a .json input must be an array of strings or of objects with a text field");
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr[i];
    const json* s = &e;
    if (e.is_object()) {
      auto it = e.find(field);
      if (it == e.end())
        throw DataError("'" + path.string() + "' element " + std::to_string(i) + " has no field \"" + field + "\"",
                        "pass --text-field NAME with the field that holds the document text");
      s = &*it;
    }
    if (!s->is_string())
      throw DataError("'" + path.string() + "' element " + std::to_string(i) + " is " + s->type_name() +
                          ", not a string",
                      "a .json input must be an array of strings or of objects with a string text field");
    if (!s->get_ref<const std::string&>().empty()) docs.push_back(s->get<std::string>());
  }
}

}  // namespace

std::vector<std::string> split_text_documents(const std::string& text) {
  std::vector<std::string> docs;
  std::string cur;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
    if (blank(line)) {
      if (!cur.empty()) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      if (!cur.empty()) cur += '\n';
      cur += line;
    }
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

SourceInfo read_documents(const fs::path& path, const std::string& text_field, std::vector<std::string>& docs) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw DataError("input file '" + path.string() + "' does not exist", "check the --input paths");
  if (!fs::is_regular_file(path, ec))
    throw DataError("input '" + path.string() + "' is not a regular file", "pass files, not directories, to --input");
  const std::string ext = path.extension().string();
  if (ext != ".txt" && ext != ".jsonl" && ext != ".json")
    throw DataError("input '" + path.string() + "' has unsupported extension '" + ext + "'",
                    "supported inputs: .txt (documents separated by blank lines), .jsonl (one object per line), "
                    ".json (array of strings or objects); rename the file to match its format");
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    throw DataError(e.what(), "check the file's permissions");
  }
  SourceInfo info{path, static_cast<int64_t>(text.size()), sha256_hex(text), 0};
  const size_t before = docs.size();
  if (!blank(text)) {
    if (ext == ".jsonl") read_jsonl(path, text, text_field, docs);
    else if (ext == ".json") read_json(path, text, text_field, docs);
    else for (auto& d : split_text_documents(text)) docs.push_back(std::move(d));
  }
  info.documents = static_cast<int64_t>(docs.size() - before);
  if (info.documents == 0)
    throw DataError("input '" + path.string() + "' contains no text (" + std::to_string(text.size()) + " bytes, no documents)",
                    "remove the empty file from --input or fill it");
  return info;
}

}  // namespace gasloc::data
