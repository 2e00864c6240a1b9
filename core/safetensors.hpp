// The safetensors file format for named float32 arrays: an 8-byte little-endian header length,
// a JSON header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the row-major data. Python's safetensors (or a few
// lines of numpy) opens these files. Files may hold F32, F16 or BF16 tensors; in memory every
// array is float32.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

using Metadata = std::map<std::string, std::string>;

// The element types xgrad reads and writes: F32, F16 (IEEE half) and BF16 (bfloat16, the top
// half of a float32).
enum class Dtype { f32, f16, bf16 };

// "F32", "F16", "BF16": the names in a file's header.
const char* dtype_name(Dtype dtype);

struct SafetensorsContents {
  NamedArrays tensors;  // in file order (by data offset)
  Metadata metadata;
};

// Writes atomically (write_file_atomically: a temporary file in the same folder, synced, then
// renamed over `path`), so a crash mid-save leaves any earlier file at `path` intact. First removes
// the temporaries that killed saves of the same path left (remove_stale_temporaries).
// `dtype` F16 or BF16 rounds every value to nearest, ties to even; a finite value that would round
// past the type's largest finite value (65504 for F16) is an Error naming the tensor and the value,
// checked before anything is written. Infinities and NaNs stay infinities and NaNs.
void save_safetensors(const std::string& path, const NamedArrays& tensors, const Metadata& metadata = {},
                      Dtype dtype = Dtype::f32);

// Reads and checks everything (sizes, JSON, dtypes, shapes, offsets in range, no holes or
// overlaps); any problem is an Error naming the file and what is wrong. A folder, a device or a
// fifo is refused before reading, and a header that promises more than the file holds before the
// data is read. Also removes stale temporaries of `path`, as save_safetensors does. F16 and BF16
// values become float32 exactly (subnormals, infinities and NaNs included); any other dtype is an
// Error naming the tensor and the dtype.
SafetensorsContents load_safetensors(const std::string& path);

// The same checks on bytes already in memory; `what` names them in errors.
SafetensorsContents parse_safetensors(const std::string& bytes, const std::string& what = "buffer");

// One value's conversions, as the reader and writer do them. The narrowing ones round to
// nearest, ties to even, and map a finite value past the type's range to infinity (the writer
// refuses those instead).
float f16_to_f32(std::uint16_t bits);
float bf16_to_f32(std::uint16_t bits);
std::uint16_t f32_to_f16(float value);
std::uint16_t f32_to_bf16(float value);

}  // namespace xgrad
