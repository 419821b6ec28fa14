// The .npy reader/writer (tools/npy.h): round trips, headers as NumPy writes them (versions
// 1.0, 2.0, 3.0), and the refusals (big-endian, Fortran order, other dtypes, truncation).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "core/element_access.h"
#include "dpa/error.h"
#include "npy.h"

namespace dpa::npy {
namespace {

// A file with `header` (the dict text) in format `major`.0, followed by `data`. The header is
// padded like NumPy pads it: spaces, then '\n', to a multiple of 64 bytes.
std::string make_file(const std::string& header_dict, int major, const std::string& data) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  std::string header = header_dict;
  size_t total = 6 + 2 + length_bytes + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string file = "\x93NUMPY";
  file += char(major);
  file += char(0);
  for (size_t i = 0; i < length_bytes; ++i) file += char((header.size() >> (8 * i)) & 0xff);
  return file + header + data;
}

template <typename T>
std::string raw_bytes(std::initializer_list<T> values) {
  std::string bytes;
  for (T v : values) bytes.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return bytes;
}

// Expects decode to throw kIo with a message containing every fragment.
void expect_refused(const std::string& file, std::initializer_list<const char*> fragments) {
  try {
    decode(file, "input.npy");
    FAIL() << "decode accepted a bad file";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    std::string message = error.what();
    EXPECT_NE(message.find("input.npy"), std::string::npos) << message;
    for (const char* fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

double get(const Array& a, int64_t i) { return load_element(a.bytes.data(), a.dtype, i); }

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  const DType dtypes[] = {DType::kFloat16, DType::kFloat32, DType::kFloat64, DType::kInt32,
                          DType::kBool};
  const std::vector<std::vector<int64_t>> shapes = {{},           {5},    {2, 3},
                                                    {2, 3, 4, 5}, {0, 4}, {1, 1, 7}};
  for (DType dtype : dtypes) {
    for (const auto& shape : shapes) {
      Array a(dtype, shape);
      for (int64_t i = 0; i < a.numel(); ++i)
        store_element(a.bytes.data(), dtype, i, dtype == DType::kBool ? (i % 3 == 0) : i - 3.5);
      std::string file = encode(a);
      // NumPy's layout: version 1.0, data aligned to 64 bytes.
      ASSERT_EQ(file.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
      size_t header_length = uint8_t(file[8]) | (uint8_t(file[9]) << 8);
      EXPECT_EQ((10 + header_length) % 64, 0u);
      EXPECT_EQ(file[10 + header_length - 1], '\n');
      Array b = decode(file, "x.npy");
      EXPECT_EQ(b.dtype, dtype);
      EXPECT_EQ(b.shape, shape);
      EXPECT_EQ(b.bytes, a.bytes);
    }
  }
}

TEST(Npy, WritesNumPyHeaderText) {
  Array a(DType::kFloat32, {7});
  std::string file = encode(a);
  EXPECT_NE(file.find("{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }"),
            std::string::npos);
  EXPECT_NE(encode(Array(DType::kBool, {2, 3})).find("'descr': '|b1'"), std::string::npos);
  EXPECT_NE(encode(Array(DType::kFloat64, {})).find("'shape': ()"), std::string::npos);
  EXPECT_THROW(encode(Array(DType::kBFloat16, {2})), Error);  // NumPy has no bfloat16
}

TEST(Npy, ReadsHeadersAsNumPyWritesThem) {
  // NumPy >= 1.23 leaves room after the dict so the shape can grow in place.
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(21, ' ');
  std::string data = raw_bytes<float>({0, 1, 2, 3, 4, 5});
  for (int major : {1, 2, 3}) {
    Array a = decode(make_file(dict, major, data), "v.npy");
    EXPECT_EQ(a.dtype, DType::kFloat32);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(get(a, 5), 5.0);
  }
  // Key order, quotes, spacing and Python 2 long literals vary across writers.
  Array b = decode(make_file("{\"shape\":(3L,),\"fortran_order\":False,\"descr\":\"<i4\"}", 1,
                             raw_bytes<int32_t>({7, -8, 9})),
                   "w.npy");
  EXPECT_EQ(b.dtype, DType::kInt32);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(get(b, 1), -8.0);
}

TEST(Npy, ReadsFloat16AndMasks) {
  // 1.0, -2.0, 0.5 in IEEE half precision.
  Array h = decode(make_file("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", 1,
                             raw_bytes<uint16_t>({0x3c00, 0xc000, 0x3800})),
                   "h.npy");
  EXPECT_EQ(h.dtype, DType::kFloat16);
  EXPECT_EQ(get(h, 0), 1.0);
  EXPECT_EQ(get(h, 1), -2.0);
  EXPECT_EQ(get(h, 2), 0.5);
  // uint8 masks load as bool; any non-zero byte is true and is stored as 1.
  Array m = decode(make_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 1,
                             std::string("\x00\x01\x07\xff", 4)),
                   "m.npy");
  EXPECT_EQ(m.dtype, DType::kBool);
  EXPECT_EQ(m.bytes, (std::vector<unsigned char>{0, 1, 1, 1}));
  Array b = decode(make_file("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", 1,
                             std::string("\x01\x00", 2)),
                   "b.npy");
  EXPECT_EQ(b.dtype, DType::kBool);
}

TEST(Npy, RefusesWhatItCannotRepresent) {
  const std::string floats = raw_bytes<float>({1, 2});
  expect_refused(make_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 1, floats),
                 {"'>f4'", "big-endian"});
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 1), }", 1, floats),
                 {"Fortran order"});
  expect_refused(make_file("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", 1,
                           raw_bytes<int64_t>({1})),
                 {"'<i8'", "not supported"});
  expect_refused(make_file("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 1, floats),
                 {"'<c8'"});
  expect_refused(
      make_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 1, floats),
      {"structured"});
  // Truncated data, and data past the end of the array.
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 1, floats),
                 {"truncated"});
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 1, floats),
                 {"needs 4"});
  expect_refused(make_file("{'descr': '<f4', 'shape': (2,), }", 1, floats), {"fortran_order"});
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 1, floats),
                 {"malformed"});
  expect_refused("not a numpy file at all", {"magic"});
  std::string v4 =
      make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 2, floats);
  v4[6] = 4;
  expect_refused(v4, {"version 4.0"});
  expect_refused(std::string("\x93NUMPY\x01\x00\xff\x00{", 11), {"truncated"});
}

TEST(Npy, LoadAndSaveNameTheFileAndArgument) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("dpa_test_npy_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "a.npy").string();
  Array a(DType::kFloat64, {2, 2});
  store_element(a.bytes.data(), a.dtype, 3, 42.0);
  save(path, a);
  Array b = load(path, "q");
  EXPECT_EQ(b.bytes, a.bytes);

  const std::string missing = (dir / "missing.npy").string();
  try {
    load(missing, "softmax-offset");
    FAIL() << "loaded a missing file";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_EQ(error.argument(), "softmax-offset");
    EXPECT_NE(std::string(error.what()).find(missing), std::string::npos) << error.what();
  }
  EXPECT_THROW(save((dir / "no_such_dir" / "x.npy").string(), a), Error);
  std::filesystem::remove_all(dir);
}

// Issue 15's reader findings: each of these was accepted (or crashed) before.
TEST(Npy, RefusesHeadersThatHideOverflowOrRepeatKeys) {
  // A zero extent used to end the size check, so the strides of the rest overflowed later.
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (0, 1099511627776, 1099511627776, 8), }",
                           1, ""),
                 {"extent above"});
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (0, 2000000000, 2000000000, 2000000000), }",
                           1, ""),
                 {"too large"});
  // Zero data but 2^40 heads: refused instead of minutes of work per head.
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (1, 0, 1099511627776, 8), }",
                           1, ""),
                 {"extent above"});
  expect_refused(make_file("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, "
                           "'shape': (1,), }",
                           1, raw_bytes<float>({1.0f})),
                 {"repeats the key 'descr'"});
  expect_refused(make_file("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (1, 1, 1, 1, 1, 1), }",
                           1, raw_bytes<float>({1.0f})),
                 {"6 dimensions"});
}

TEST(Npy, LoadRefusesWhatIsNotARegularFileByName) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("dpa_test_npy_dir_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  for (const std::string& path : {dir.string(), std::string("/dev/zero")}) {
    try {
      load(path, "q");
      ADD_FAILURE() << "loaded " << path;
    } catch (const Error& error) {
      EXPECT_EQ(error.argument(), "q");
      EXPECT_NE(std::string(error.what()).find("not a regular file"), std::string::npos)
          << error.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Npy, ViewsAndCopies) {
  Array a(DType::kFloat32, {2, 3, 4});
  for (int64_t i = 0; i < a.numel(); ++i) store_element(a.bytes.data(), a.dtype, i, double(i));
  TensorView view = a.view();
  EXPECT_EQ(view.ndim, 3);
  EXPECT_EQ(view.data, a.bytes.data());
  EXPECT_EQ(view.stride(0), 12);
  EXPECT_EQ(view.stride(2), 1);
  EXPECT_TRUE(Array(DType::kFloat32, {0, 3}).view().defined());  // empty but defined
  EXPECT_THROW(Array(DType::kFloat32, {1, 1, 1, 1, 1, 1}).view(), Error);

  // A strided view (a[:, 1, ::2]) copies into C order.
  TensorView strided = view;
  strided.ndim = 2;
  strided.shape = {2, 2};
  strided.strides = {12, 2};
  strided.data = a.bytes.data() + 4 * sizeof(float);
  Array b = Array::from_view(strided);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(get(b, 0), 4.0);
  EXPECT_EQ(get(b, 1), 6.0);
  EXPECT_EQ(get(b, 2), 16.0);
  EXPECT_EQ(get(b, 3), 18.0);
}

}  // namespace
}  // namespace dpa::npy
