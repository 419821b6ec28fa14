#include "npy.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <utility>

#include "dpa/error.h"

namespace dpa::npy {

// Array bytes are copied straight to and from the file, which stores little-endian data.
static_assert(std::endian::native == std::endian::little, "dpa::npy assumes a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// Header + preamble are padded to a multiple of 64 bytes so that the data is aligned
// (what NumPy itself writes since 1.x).
constexpr size_t kHeaderAlignment = 64;
// The largest extent of any dimension: the kernels index rows, heads and keys with int32.
constexpr int64_t kMaxExtent = int64_t(1) << 31;
// The largest file read (64 GiB): beyond any attention input a host run can hold, and a bound
// that turns a runaway read into a named error.
constexpr uintmax_t kMaxFileBytes = uintmax_t(64) << 30;

[[noreturn]] void fail(const std::string& argument, const std::string& name,
                       const std::string& message) {
  throw Error(ErrorCode::kIo, argument, "'" + name + "': " + message);
}

// The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// This parser accepts exactly the literals that can appear in it: strings, True/False and
// tuples of non-negative integers. Anything else (e.g. a structured dtype's list) is refused.
struct HeaderValue {
  enum Kind { kString, kBool, kTuple } kind = kString;
  std::string text;
  bool flag = false;
  std::vector<int64_t> ints;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& argument, const std::string& name)
      : text_(text), argument_(argument), name_(name) {}

  std::vector<std::pair<std::string, HeaderValue>> parse_dict() {
    std::vector<std::pair<std::string, HeaderValue>> entries;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = parse_string();
      expect(':');
      entries.emplace_back(key, parse_value());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') error("expected ',' or '}' in the header");
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) error("unexpected text after the header dict");
    return entries;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail(argument_, name_, "malformed .npy header (" + what + "): " + std::string(text_));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }

  std::string parse_string() {
    skip_space();
    char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a string");
    size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) error("unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }

  int64_t parse_int() {
    skip_space();
    size_t start = pos_;
    int64_t value = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      int digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) error("dimension too large");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) error("expected a non-negative integer in the shape");
    if (peek() == 'L') ++pos_;  // Python 2 long literal
    return value;
  }

  HeaderValue parse_value() {
    skip_space();
    HeaderValue value;
    char c = peek();
    if (c == '\'' || c == '"') {
      value.kind = HeaderValue::kString;
      value.text = parse_string();
    } else if (text_.substr(pos_, 4) == "True") {
      value.kind = HeaderValue::kBool;
      value.flag = true;
      pos_ += 4;
    } else if (text_.substr(pos_, 5) == "False") {
      value.kind = HeaderValue::kBool;
      value.flag = false;
      pos_ += 5;
    } else if (c == '(') {
      value.kind = HeaderValue::kTuple;
      ++pos_;
      while (true) {
        skip_space();
        if (peek() == ')') break;
        value.ints.push_back(parse_int());
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        if (peek() != ')') error("expected ',' or ')' in the shape");
      }
      ++pos_;
    } else if (c == '[') {
      fail(argument_, name_, "structured dtypes are not supported");
    } else {
      error("unexpected value");
    }
    return value;
  }

  std::string_view text_;
  size_t pos_ = 0;
  const std::string& argument_;
  const std::string& name_;
};

std::optional<DType> dtype_from_descr(const std::string& d, bool* from_uint8) {
  *from_uint8 = false;
  // Single-byte types carry no byte order ('|'), though '<' and '=' mean the same for them.
  // '=' is native order, which static_assert above pins to little-endian.
  if (d.size() != 3 || (d[0] != '<' && d[0] != '=' && d[0] != '|')) return std::nullopt;
  std::string_view kind = std::string_view(d).substr(1);
  if (d[0] != '|') {
    if (kind == "f2") return DType::kFloat16;
    if (kind == "f4") return DType::kFloat32;
    if (kind == "f8") return DType::kFloat64;
    if (kind == "i4") return DType::kInt32;
  }
  if (kind == "b1") return DType::kBool;
  if (kind == "u1") {
    *from_uint8 = true;
    return DType::kBool;
  }
  return std::nullopt;
}

uint32_t read_le(std::string_view bytes, size_t at, int count) {
  uint32_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | uint8_t(bytes[at + size_t(i)]);
  return value;
}

}  // namespace

Array::Array(DType dtype_in, std::vector<int64_t> shape_in)
    : dtype(dtype_in), shape(std::move(shape_in)) {
  bytes.assign(size_t(numel()) * dtype_size(dtype), 0);
}

int64_t Array::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

std::string Array::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

TensorView Array::view() { return std::as_const(*this).view(); }

TensorView Array::view() const {
  if (ndim() > kMaxDims) {
    throw Error(ErrorCode::kIo, "",
                "array of shape " + shape_string() + " has more than " + std::to_string(kMaxDims) +
                    " dimensions");
  }
  // A view of zero elements still needs a non-null pointer to count as defined.
  static unsigned char empty_storage[8];
  void* data =
      bytes.empty() ? static_cast<void*>(empty_storage) : const_cast<unsigned char*>(bytes.data());
  return TensorView::contiguous(data, dtype, shape.data(), ndim());
}

Array Array::from_view(const TensorView& view) {
  if (view.device != Device::kCPU) {
    throw Error(ErrorCode::kIo, "", "cannot copy a device tensor into a host array");
  }
  Array array(view.dtype, std::vector<int64_t>(view.shape.begin(), view.shape.begin() + view.ndim));
  const int64_t count = array.numel();
  if (count == 0) return array;
  const size_t element = dtype_size(view.dtype);
  const auto* source = static_cast<const unsigned char*>(view.data);
  std::vector<int64_t> index(size_t(view.ndim), 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t offset = 0;
    for (int d = 0; d < view.ndim; ++d) offset += index[size_t(d)] * view.strides[size_t(d)];
    std::memcpy(array.bytes.data() + size_t(flat) * element, source + offset * int64_t(element),
                element);
    // Advance the multi-index in C order.
    for (int d = view.ndim - 1; d >= 0; --d) {
      if (++index[size_t(d)] < view.shape[size_t(d)]) break;
      index[size_t(d)] = 0;
    }
  }
  return array;
}

std::string descr(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "<f2";
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kInt32:
      return "<i4";
    case DType::kBool:
      return "|b1";
    case DType::kBFloat16:
      break;
  }
  throw Error(ErrorCode::kIo, "", "bfloat16 has no .npy dtype; convert to float32 first");
}

namespace {

Array decode_impl(std::string_view file, const std::string& name, const std::string& argument) {
  if (file.size() < 10 || file.substr(0, kMagic.size()) != kMagic) {
    fail(argument, name, "not a .npy file (bad magic string)");
  }
  const int major = uint8_t(file[6]);
  const int minor = uint8_t(file[7]);
  size_t header_start = 0, header_length = 0;
  if (major == 1 && minor == 0) {
    header_start = 10;
    header_length = read_le(file, 8, 2);
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (file.size() < 12) fail(argument, name, "truncated .npy header");
    header_start = 12;
    header_length = read_le(file, 8, 4);
  } else {
    fail(argument, name,
         "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor));
  }
  if (file.size() < header_start + header_length) fail(argument, name, "truncated .npy header");
  std::string_view header = file.substr(header_start, header_length);

  HeaderParser parser(header, argument, name);
  std::optional<std::string> descr_value;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
  std::vector<std::string> seen;
  for (auto& [key, value] : parser.parse_dict()) {
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      fail(argument, name, "the .npy header repeats the key '" + key + "'");
    seen.push_back(key);
    if (key == "descr" && value.kind == HeaderValue::kString) {
      descr_value = value.text;
    } else if (key == "fortran_order" && value.kind == HeaderValue::kBool) {
      fortran_order = value.flag;
    } else if (key == "shape" && value.kind == HeaderValue::kTuple) {
      shape = value.ints;
    } else {
      fail(argument, name, "unexpected .npy header entry '" + key + "'");
    }
  }
  if (!descr_value || !fortran_order || !shape) {
    fail(argument, name, "the .npy header lacks 'descr', 'fortran_order' or 'shape'");
  }
  if (*fortran_order) {
    fail(argument, name,
         "is stored in Fortran order; only C order is supported (save "
         "np.ascontiguousarray(a))");
  }
  bool from_uint8 = false;
  std::optional<DType> dtype = dtype_from_descr(*descr_value, &from_uint8);
  if (!dtype) {
    std::string message = "dtype '" + *descr_value + "' is not supported";
    if (!descr_value->empty() && descr_value->front() == '>') message += " (big-endian data)";
    message +=
        "; expected little-endian float16 '<f2', float32 '<f4', float64 '<f8', int32 '<i4', "
        "or bool '|b1' / uint8 '|u1'";
    fail(argument, name, message);
  }

  Array array;
  array.dtype = *dtype;
  array.shape = *shape;
  if (array.shape.size() > size_t(kMaxDims))
    fail(argument, name,
         "has " + std::to_string(array.shape.size()) + " dimensions; dpa takes at most " +
             std::to_string(kMaxDims));
  // Every extent is bounded (kernels index with int32), and the product of the non-zero ones
  // must fit in bytes: a zero extent must not hide a product that overflows the strides.
  int64_t nonzero_product = 1;
  bool empty = false;
  for (int64_t extent : array.shape) {
    if (extent > kMaxExtent)
      fail(argument, name,
           "shape " + array.shape_string() + " has an extent above " + std::to_string(kMaxExtent));
    if (extent == 0) {
      empty = true;
      continue;
    }
    if (nonzero_product > std::numeric_limits<int64_t>::max() / 8 / extent)
      fail(argument, name, "shape " + array.shape_string() + " is too large");
    nonzero_product *= extent;
  }
  const int64_t count = empty ? 0 : nonzero_product;
  const size_t data_bytes = size_t(count) * dtype_size(array.dtype);
  const size_t data_start = header_start + header_length;
  const size_t available = file.size() - data_start;
  if (available != data_bytes) {
    fail(argument, name,
         "holds " + std::to_string(available) + " data bytes, but shape " + array.shape_string() +
             " of '" + *descr_value + "' needs " + std::to_string(data_bytes) +
             (available < data_bytes ? " (truncated file?)" : ""));
  }
  array.bytes.assign(file.begin() + std::ptrdiff_t(data_start), file.end());
  // uint8 masks become bool: any non-zero byte is true, stored as 1 like NumPy's bool.
  if (from_uint8) {
    for (unsigned char& byte : array.bytes) byte = byte != 0;
  }
  return array;
}

}  // namespace

Array decode(std::string_view file_bytes, const std::string& name) {
  return decode_impl(file_bytes, name, "");
}

std::string encode(const Array& array) {
  std::string dict = "{'descr': '" + descr(array.dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < array.shape.size(); ++i) {
    dict += std::to_string(array.shape[i]);
    // A one-element tuple needs its trailing comma: (5,).
    dict += (array.shape.size() == 1) ? "," : (i + 1 < array.shape.size() ? ", " : "");
  }
  dict += "), }";
  const size_t preamble = kMagic.size() + 2 + 2;  // magic, version, uint16 header length
  size_t total = preamble + dict.size() + 1;      // + the terminating newline
  size_t padded = (total + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
  dict.append(padded - total, ' ');
  dict += '\n';
  if (dict.size() > 0xffff) {
    throw Error(ErrorCode::kIo, "", "shape " + array.shape_string() + " is too long for .npy 1.0");
  }
  const size_t expected = size_t(array.numel()) * dtype_size(array.dtype);
  if (array.bytes.size() != expected) {
    throw Error(ErrorCode::kInternal, "",
                "npy::Array holds " + std::to_string(array.bytes.size()) + " bytes; shape " +
                    array.shape_string() + " needs " + std::to_string(expected));
  }

  std::string out;
  out.reserve(dict.size() + preamble + array.bytes.size());
  out += kMagic;
  out += char(1);  // version 1.0
  out += char(0);
  out += char(dict.size() & 0xff);
  out += char((dict.size() >> 8) & 0xff);
  out += dict;
  out.append(reinterpret_cast<const char*>(array.bytes.data()), array.bytes.size());
  return out;
}

Array load(const std::string& path, const std::string& argument) {
  // Only regular files, of a bounded size, are read: a directory, a FIFO or /dev/zero would
  // otherwise fail obscurely or grow memory without end.
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error) fail(argument, path, "cannot open: " + error.message());
  if (!std::filesystem::is_regular_file(status)) fail(argument, path, "is not a regular file");
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) fail(argument, path, "cannot read its size: " + error.message());
  if (size > kMaxFileBytes)
    fail(argument, path,
         "is " + std::to_string(size) + " bytes; dpa reads .npy files of at most " +
             std::to_string(kMaxFileBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(argument, path, std::string("cannot open: ") + std::strerror(errno));
  std::string contents;
  try {
    contents.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::bad_alloc&) {
    fail(argument, path, "does not fit in memory (" + std::to_string(size) + " bytes)");
  }
  if (in.bad()) fail(argument, path, "read error");
  return decode_impl(contents, path, argument);
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("", path, std::string("cannot create: ") + std::strerror(errno));
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.close();
  if (!out) fail("", path, "write error");
}

void save(const std::string& path, const Array& array) { write_file(path, encode(array)); }

}  // namespace dpa::npy
