#include "core/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

namespace shoal {
namespace {

struct DescrEntry {
  const char* descr;
  DataType type;
};
constexpr DescrEntry kDescrs[] = {
    {"|b1", DataType::kBool},   {"|u1", DataType::kUint8},  {"<u2", DataType::kUint16},
    {"<u4", DataType::kUint32}, {"<u8", DataType::kUint64}, {"|i1", DataType::kInt8},
    {"<i2", DataType::kInt16},  {"<i4", DataType::kInt32},  {"<i8", DataType::kInt64},
    {"<f2", DataType::kFp16},   {"<f4", DataType::kFp32},   {"<f8", DataType::kFp64},
};

std::string DescrFor(DataType t) {
  for (const auto& d : kDescrs) {
    if (d.type == t) return d.descr;
  }
  return "";
}

uint32_t Le32(const unsigned char* p) {
  return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
}
uint16_t Le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// numpy (1.24 and later) refuses longer headers by default: its parser is not safe on
// arbitrary input. Ours uses std::regex, which recurses per character matched.
constexpr size_t kMaxHeaderBytes = 10000;
// Deflate cannot expand input by more than about 1032:1 (258-byte matches coded in
// 2 bits); a member claiming more is corrupt, and is refused before its size is allocated.
constexpr uint64_t kMaxDeflateRatio = 1032;

std::shared_ptr<Buffer> MapFileOrNull(const std::string& path, Status* status) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    *status = NotFound("cannot open '" + path + "': " + std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  fstat(fd, &st);
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    close(fd);
    *status = InvalidArgument("'" + path + "' is empty");
    return nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *status = Internal("cannot map '" + path + "'");
    return nullptr;
  }
  std::shared_ptr<const void> owner(p,
                                    [size](const void* q) { munmap(const_cast<void*>(q), size); });
  return Buffer::Wrap(p, size, owner);
}

}  // namespace

size_t NpyArray::row_bytes() const {
  if (rows() == 0) return 0;
  return data->size() / static_cast<size_t>(rows());
}

Tensor NpyArray::Row(int64_t i) const {
  Shape s = shape;
  if (s.empty()) s = {1};
  s[0] = 1;
  const size_t rb = row_bytes();
  return Tensor(dtype, s, data, static_cast<size_t>(i) * rb, rb);
}

StatusOr<NpyArray> ParseNpy(std::shared_ptr<Buffer> file, const std::string& name) {
  const auto* p = static_cast<const unsigned char*>(file->data());
  const size_t size = file->size();
  if (size < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0)
    return InvalidArgument("'" + name + "' is not an .npy file");
  const int major = p[6];
  size_t header_len, offset;
  if (major == 1) {
    header_len = Le16(p + 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return InvalidArgument("'" + name + "' is truncated");
    header_len = Le32(p + 8);
    offset = 12;
  } else {
    return InvalidArgument("'" + name + "' has .npy version " + std::to_string(major) +
                           ", which is not supported");
  }
  if (header_len > kMaxHeaderBytes) {
    return InvalidArgument("'" + name + "' has a header of " + std::to_string(header_len) +
                           " bytes; at most " + std::to_string(kMaxHeaderBytes) +
                           " are read (as numpy does)");
  }
  if (offset + header_len > size)
    return InvalidArgument("'" + name + "' is truncated in its header");
  const std::string header(reinterpret_cast<const char*>(p + offset), header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'"))) {
    return InvalidArgument("'" + name + "' has no descr in its header");
  }
  const std::string descr = m[1];
  NpyArray a;
  for (const auto& d : kDescrs) {
    if (descr == d.descr || (descr.size() == 3 && descr[0] == '=' &&
                             descr.substr(1) == std::string(d.descr).substr(1))) {
      a.dtype = d.type;
    }
  }
  if (a.dtype == DataType::kInvalid) {
    return InvalidArgument(
        "'" + name + "' has dtype '" + descr +
        "', which shoal cannot read (little-endian bool, int, uint and float only)");
  }
  if (std::regex_search(header, std::regex("'fortran_order':\\s*True"))) {
    return InvalidArgument("'" + name +
                           "' is in Fortran order; save it with numpy.ascontiguousarray first");
  }
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) {
    return InvalidArgument("'" + name + "' has no shape in its header");
  }
  std::stringstream ss(m[1].str());
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    if (item.empty()) continue;
    try {
      a.shape.push_back(std::stoll(item));
    } catch (...) {
      return InvalidArgument("'" + name + "' has a malformed shape '" + m[1].str() + "'");
    }
  }
  // Bounded so that the byte count cannot overflow (a wrapped count would pass the size
  // check below with a shape far larger than the data).
  const size_t element = DataTypeSize(a.dtype);
  auto count = ElementCount(a.shape, static_cast<int64_t>(INT64_MAX / element));
  if (!count.ok()) return count.status().WithPrefix("'" + name + "'");
  const size_t data_bytes = static_cast<size_t>(*count) * element;
  const size_t data_offset = offset + header_len;
  if (size - data_offset < data_bytes) {
    return InvalidArgument("'" + name + "' is truncated: shape " + ShapeToString(a.shape) +
                           " needs " + std::to_string(data_bytes) +
                           " bytes of data, the file has " + std::to_string(size - data_offset));
  }
  const unsigned char* data = p + data_offset;
  if (reinterpret_cast<uintptr_t>(data) % element != 0) {
    // Members of an uncompressed .npz sit at arbitrary offsets: copy them to aligned
    // memory so elements can be read as their type.
    a.data = Buffer::Allocate(data_bytes);
    if (data_bytes > 0) std::memcpy(a.data->data(), data, data_bytes);
  } else {
    a.data = Buffer::Wrap(const_cast<unsigned char*>(data), data_bytes, file);
  }
  return a;
}

StatusOr<std::shared_ptr<Buffer>> MapFile(const std::string& path) {
  Status s;
  auto file = MapFileOrNull(path, &s);
  if (!file) return s;
  return file;
}

StatusOr<NpyArray> ReadNpy(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MapFile(path));
  return ParseNpy(file, path);
}

StatusOr<std::map<std::string, NpyArray>> ReadNpz(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MapFile(path));
  return ParseNpz(file, path);
}

StatusOr<std::map<std::string, NpyArray>> ParseNpz(std::shared_ptr<Buffer> file,
                                                   const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(file->data());
  const size_t size = file->size();
  // Walk the central directory (sizes are reliable there even when the local header
  // defers them to a data descriptor).
  if (size < 22) return InvalidArgument("'" + path + "' is not a zip (.npz) archive");
  size_t eocd = size - 22;
  while (eocd > 0 && Le32(p + eocd) != 0x06054b50) --eocd;
  if (Le32(p + eocd) != 0x06054b50)
    return InvalidArgument("'" + path + "' is not a zip (.npz) archive");
  const uint16_t entries = Le16(p + eocd + 10);
  size_t cd = Le32(p + eocd + 16);
  std::map<std::string, NpyArray> out;
  for (uint16_t e = 0; e < entries; ++e) {
    if (cd + 46 > size || Le32(p + cd) != 0x02014b50)
      return InvalidArgument("'" + path + "' has a broken zip directory");
    const uint16_t method = Le16(p + cd + 10);
    const uint32_t csize = Le32(p + cd + 20), usize = Le32(p + cd + 24);
    const uint16_t nlen = Le16(p + cd + 28), xlen = Le16(p + cd + 30), clen = Le16(p + cd + 32);
    const uint32_t local = Le32(p + cd + 42);
    if (cd + 46 + nlen > size) return InvalidArgument("'" + path + "' has a broken zip directory");
    std::string member(reinterpret_cast<const char*>(p + cd + 46), nlen);
    cd += 46 + nlen + xlen + clen;
    if (csize == 0xffffffffu || usize == 0xffffffffu) {
      return InvalidArgument("'" + path + "' member '" + member +
                             "' is a zip64 entry (over 4 GiB), not supported");
    }
    // In size_t: `local` near 4 GiB must not wrap past the check.
    if (size_t{local} + 30 > size || Le32(p + local) != 0x04034b50)
      return InvalidArgument("'" + path + "' has a broken zip entry");
    const size_t data = size_t{local} + 30 + Le16(p + local + 26) + Le16(p + local + 28);
    if (data + csize > size)
      return InvalidArgument("'" + path + "' member '" + member + "' is truncated");
    std::shared_ptr<Buffer> bytes;
    if (method == 0) {
      bytes = Buffer::Wrap(const_cast<unsigned char*>(p) + data, csize, file);
    } else if (method == 8) {
      if (usize > uint64_t{csize} * kMaxDeflateRatio + 1024) {
        return InvalidArgument("'" + path + "' member '" + member + "' claims " +
                               std::to_string(usize) + " bytes from " + std::to_string(csize) +
                               " compressed, more than deflate can produce");
      }
      bytes = Buffer::AllocateUninitialized(usize);
      z_stream zs{};
      if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)
        return Internal("'" + path + "': zlib could not start inflating");
      zs.next_in = const_cast<Bytef*>(p + data);
      zs.avail_in = csize;
      zs.next_out = static_cast<Bytef*>(bytes->data());
      zs.avail_out = usize;
      const int rc = inflate(&zs, Z_FINISH);
      inflateEnd(&zs);
      if (rc != Z_STREAM_END || zs.total_out != usize) {
        return InvalidArgument("'" + path + "' member '" + member + "' does not decompress");
      }
    } else {
      return InvalidArgument("'" + path + "' member '" + member + "' uses zip method " +
                             std::to_string(method) + "; only stored and deflated are supported");
    }
    std::string name = member;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".npy") name.resize(name.size() - 4);
    ASSIGN_OR_RETURN(NpyArray a, ParseNpy(bytes, path + ":" + member));
    out.emplace(name, std::move(a));
  }
  return out;
}

StatusOr<std::string> NpyHeader(DataType dtype, const Shape& shape) {
  const std::string descr = DescrFor(dtype);
  if (descr.empty())
    return InvalidArgument(std::string(DataTypeName(dtype)) + " cannot be written to .npy");
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i)
    dict +=
        std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  dict += "), }";
  size_t total = 10 + dict.size() + 1;
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(dict.size());
  header.push_back(static_cast<char>(len & 0xff));
  header.push_back(static_cast<char>(len >> 8));
  return header + dict;
}

StatusOr<std::unique_ptr<NpyWriter>> NpyWriter::Open(const std::string& path, DataType dtype,
                                                     Shape shape, bool resume) {
  ASSIGN_OR_RETURN(std::string header, NpyHeader(dtype, shape));
  ASSIGN_OR_RETURN(int64_t elements, ElementCount(shape));
  std::unique_ptr<NpyWriter> w(new NpyWriter());
  w->path_ = path;
  w->header_bytes_ = header.size();
  w->rows_ = shape.empty() ? 1 : shape[0];
  const size_t data_bytes = static_cast<size_t>(elements) * DataTypeSize(dtype);
  w->row_bytes_ = w->rows_ > 0 ? data_bytes / static_cast<size_t>(w->rows_) : 0;
  if (resume) {
    std::ifstream f(path, std::ios::binary);
    std::string existing(header.size(), '\0');
    if (!f.read(existing.data(), static_cast<std::streamsize>(existing.size())) ||
        existing != header) {
      return FailedPrecondition("cannot resume into '" + path +
                                "': it does not hold an array of shape " + ShapeToString(shape) +
                                " and type " + std::string(DataTypeName(dtype)));
    }
    w->fd_ = open(path.c_str(), O_WRONLY);
  } else {
    w->fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  if (w->fd_ < 0)
    return Internal("cannot open '" + path + "' for writing: " + std::strerror(errno));
  if (!resume) {
    if (pwrite(w->fd_, header.data(), header.size(), 0) != static_cast<ssize_t>(header.size()) ||
        ftruncate(w->fd_, static_cast<off_t>(header.size() + data_bytes)) != 0) {
      return Internal("cannot write '" + path + "': " + std::strerror(errno));
    }
  }
  return w;
}

NpyWriter::~NpyWriter() {
  if (fd_ >= 0) close(fd_);
}

Status NpyWriter::WriteRow(int64_t index, const void* bytes, size_t size) {
  if (index < 0 || index >= rows_)
    return InvalidArgument("row " + std::to_string(index) + " is outside the array");
  if (size != row_bytes_) {
    return InvalidArgument("row " + std::to_string(index) + " has " + std::to_string(size) +
                           " bytes; '" + path_ + "' rows have " + std::to_string(row_bytes_));
  }
  const off_t at = static_cast<off_t>(header_bytes_ + static_cast<size_t>(index) * row_bytes_);
  if (pwrite(fd_, bytes, size, at) != static_cast<ssize_t>(size)) {
    return Internal("cannot write '" + path_ + "': " + std::strerror(errno));
  }
  return Status::Ok();
}

Status NpyWriter::Flush() {
  if (fdatasync(fd_) != 0) return Internal("cannot flush '" + path_ + "': " + std::strerror(errno));
  return Status::Ok();
}

namespace {

void Put16(std::string* s, uint32_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>((v >> 8) & 0xff));
}
void Put32(std::string* s, uint32_t v) {
  Put16(s, v & 0xffff);
  Put16(s, v >> 16);
}
// The fields a local file header and its central directory entry share, from the flags to
// the extra field's length: a stored (uncompressed) entry of `size` bytes, no extra field.
void PutEntryFields(std::string* s, uint32_t crc, uint32_t size, const std::string& file) {
  Put16(s, 0);  // flags
  Put16(s, 0);  // compression: stored
  Put16(s, 0);  // modification time
  Put16(s, 0);  // modification date
  Put32(s, crc);
  Put32(s, size);  // compressed
  Put32(s, size);  // uncompressed
  Put16(s, static_cast<uint32_t>(file.size()));
  Put16(s, 0);  // extra field length
}

}  // namespace

Status WriteNpz(const std::string& path,
                const std::vector<std::pair<std::string, Tensor>>& arrays) {
  std::string out, central;
  for (const auto& [name, tensor] : arrays) {
    ASSIGN_OR_RETURN(std::string header, NpyHeader(tensor.dtype(), tensor.shape()));
    std::string body = header;
    body.append(static_cast<const char*>(tensor.data()), tensor.byte_size());
    if (body.size() > 0xffffffffu || out.size() > 0xffffffffu)
      return InvalidArgument("WriteNpz: archives over 4 GiB need zip64");
    const std::string file = name + ".npy";
    const uint32_t crc =
        crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    const uint32_t size = static_cast<uint32_t>(body.size());
    // Local file header.
    Put32(&out, 0x04034b50);
    Put16(&out, 20);
    PutEntryFields(&out, crc, size, file);
    out += file;
    out += body;
    // Central directory entry.
    Put32(&central, 0x02014b50);
    Put16(&central, 20);
    Put16(&central, 20);
    PutEntryFields(&central, crc, size, file);
    Put16(&central, 0);  // comment length
    Put16(&central, 0);  // disk number
    Put16(&central, 0);  // internal attributes
    Put32(&central, 0);  // external attributes
    Put32(&central, offset);
    central += file;
  }
  const uint32_t central_offset = static_cast<uint32_t>(out.size());
  out += central;
  Put32(&out, 0x06054b50);
  Put16(&out, 0);
  Put16(&out, 0);
  Put16(&out, static_cast<uint32_t>(arrays.size()));
  Put16(&out, static_cast<uint32_t>(arrays.size()));
  Put32(&out, static_cast<uint32_t>(central.size()));
  Put32(&out, central_offset);
  Put16(&out, 0);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return InvalidArgument("cannot write '" + path + "'");
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!f) return Internal("writing '" + path + "' failed");
  return Status::Ok();
}

}  // namespace shoal
