// Reading raw corpora into documents for `gasloc prepare`. Formats, chosen by extension:
//   .txt    documents separated by blank lines (line breaks inside a document are kept)
//   .jsonl  one JSON object per line, the document in field `text_field` (FineWeb exports)
//   .json   an array of strings, or an array of objects with field `text_field`
// Empty documents are skipped. Errors are DataError naming the file (and line for .jsonl).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace gasloc::data {

struct SourceInfo {
  std::filesystem::path path;
  int64_t bytes = 0;
  std::string sha256;
  int64_t documents = 0;
};

// Appends the documents of `path` to `docs`. A missing, unreadable or empty file, an unknown
// extension, or malformed content throws DataError.
SourceInfo read_documents(const std::filesystem::path& path, const std::string& text_field,
                          std::vector<std::string>& docs);

// Splits plain text into documents at blank lines (exposed for tests).
std::vector<std::string> split_text_documents(const std::string& text);

}  // namespace gasloc::data
