// The safetensors file format (https://huggingface.co/docs/safetensors), as read and written by
// Hugging Face's `safetensors` package:
//
//   [u64 little-endian N][N bytes of JSON header, space-padded][raw little-endian tensor data]
//
//   header = {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"key": "value", ...}}     (offsets relative to the data start)
//
// The data section must be covered exactly by the tensors (no overlaps, no holes), as the
// reference implementation requires, so a file is either fully valid or rejected.
#pragma once
#include <torch/types.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gasloc::model {

// Writes `tensors` (any device, any layout; dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL) and
// string metadata atomically (gasloc::write_file_atomic). Tensors are stored in the given order
// except that wider element types come first, which keeps every tensor naturally aligned for
// readers that mmap the file. Throws CheckpointError on a duplicate or reserved name, an
// unsupported dtype, or a failed write.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a safetensors file into CPU tensors of the stored dtype, and the
// "__metadata__" map into *metadata when given. Validates the whole header before reading data;
// throws CheckpointError naming the file and the problem (too short, header length beyond the
// file, header not a JSON object, unknown dtype, bad shape, offsets out of range, overlapping,
// leaving holes, or not matching shape x element size).
std::map<std::string, torch::Tensor> load_safetensors(const std::filesystem::path& path,
                                                      std::map<std::string, std::string>* metadata = nullptr);

}  // namespace gasloc::model
