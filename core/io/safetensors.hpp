/// @file
/// The safetensors file format for named float32 arrays: an 8-byte little-endian header length,
/// a JSON header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
/// "__metadata__": {"key": "value"}}, then the row-major data. Python's safetensors (or a few
/// lines of numpy) opens these files. Files may hold F32, F16 or BF16 tensors; in memory every
/// array is float32.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/io/file_io.hpp"

namespace xgrad {

using Metadata = std::map<std::string, std::string>;  ///< a file's "__metadata__": text keys and values

/// The element types xgrad reads and writes: F32, F16 (IEEE half) and BF16 (bfloat16, the top
/// half of a float32).
enum class Dtype { f32, f16, bf16 };

/// "F32", "F16", "BF16": the names in a file's header.
const char* dtype_name(Dtype dtype);

/// A whole file's tensors and metadata, as load_safetensors and parse_safetensors return them.
struct SafetensorsContents {
  NamedArrays tensors;  ///< in file order (by data offset)
  Metadata metadata;    ///< the "__metadata__" entries (empty when the file has none)
};

/// Writes atomically (write_file_atomically: a temporary file in the same folder, synced, then
/// renamed over `path`), so a crash mid-save leaves any earlier file at `path` intact. First removes
/// the temporaries that killed saves of the same path left (remove_stale_temporaries).
/// `dtype` F16 or BF16 rounds every value to nearest, ties to even; a finite value that would round
/// past the type's largest finite value (65504 for F16) is an Error naming the tensor and the value,
/// checked before anything is written. Infinities and NaNs stay infinities and NaNs. Tensor names,
/// metadata keys and values that are not UTF-8 are refused (naming the bytes) before anything is
/// written, as are an empty tensor name, the name "__metadata__" and a name given twice.
void save_safetensors(const std::string& path, const NamedArrays& tensors, const Metadata& metadata = {},
                      Dtype dtype = Dtype::f32);

/// Reads and checks everything (sizes, JSON, dtypes, shapes, offsets in range, no holes or
/// overlaps, no name twice: a tensor, a metadata key, an entry's field); any problem is an Error
/// naming the file and what is wrong. No JSON tree is built: the header's memory stays a small
/// multiple of its size, and values nesting deeper than 64 levels are refused. A folder, a device or a
/// fifo is refused before reading, and a header that promises more than the file holds before the
/// data is read. Also removes stale temporaries of `path`, as save_safetensors does. F16 and BF16
/// values become float32 exactly (subnormals, infinities and NaNs included); any other dtype is an
/// Error naming the tensor and the dtype. The float32 arrays are checked against the memory this
/// process can still allocate (core/io/memory.hpp) before the first is allocated.
SafetensorsContents load_safetensors(const std::string& path);

/// The same checks on bytes already in memory; `what` names them in errors.
SafetensorsContents parse_safetensors(const std::string& bytes, const std::string& what = "buffer");

/// One tensor of a file, as its header describes it.
struct TensorInfo {
  std::string name;
  Shape shape;
  Dtype dtype;  ///< the element type stored in the file (in memory every array is float32)
  /// begin and end: the tensor's bytes are [begin, end) within the data (offsets after the header).
  std::uint64_t begin, end;
};

/// A file read tensor by tensor, for weights too large to hold twice: opening reads and checks the
/// header as load_safetensors does (and reads none of the data); read() converts a range of one
/// tensor's elements into the caller's floats, 128 KiB of the file at a time for F16 and BF16.
class SafetensorsReader {
 public:
  /// Opens `path` and reads and checks its header; any problem is an Error, as in load_safetensors.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }                    ///< the file's path, as given
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  ///< the header's tensors, by data offset
  const Metadata& metadata() const { return metadata_; }               ///< the "__metadata__" entries
  /// The index in tensors() of the tensor named `name`, or tensors().size() when there is none.
  std::size_t find(const std::string& name) const;
  /// Elements [first, first + count) of tensors()[index], in row-major order, as float32 into dst.
  /// An Error names the file when it changed since it was opened (it ends early); an index or a
  /// range past the tensor is an Error too.
  void read(std::size_t index, std::size_t first, std::size_t count, float* dst);
  /// Tensor `index` as an Array over the file's own bytes, copying nothing, when it is F32 and
  /// starts at an address aligned for float32; std::nullopt otherwise (F16 and BF16 need
  /// converting: read() them). The file is mapped at the first call (ReadableFile::map: copy-on-
  /// write; FileMapping says what it shows of a file changed in place) and stays mapped while the
  /// reader or any such Array lives. A file cut shorter since it was opened is an Error.
  std::optional<Array> map_f32(std::size_t index);

 private:
  std::string path_;
  ReadableFile file_;
  std::vector<TensorInfo> tensors_;
  Metadata metadata_;
  std::uint64_t data_start_ = 0;
  std::shared_ptr<const FileMapping> mapping_;
};

// One value's conversions, as the reader and writer do them. The narrowing ones round to
// nearest, ties to even, and map a finite value past the type's range to infinity (the writer
// refuses those instead).
float f16_to_f32(std::uint16_t bits);    ///< IEEE half to float32, exactly
float bf16_to_f32(std::uint16_t bits);   ///< bfloat16 to float32, exactly
std::uint16_t f32_to_f16(float value);   ///< float32 to IEEE half, to nearest (ties to even); past its range: infinity
std::uint16_t f32_to_bf16(float value);  ///< float32 to bfloat16, to nearest (ties to even); past its range: infinity

}  // namespace xgrad
