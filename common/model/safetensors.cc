#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using Json = nlohmann::json;

// Same cap as the reference implementation: a larger header is corrupt or hostile.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
// Elements of a tensor, and of any dimension: far beyond any real checkpoint.
constexpr uint64_t kMaxElements = uint64_t{1} << 62;

// Bits per element of every dtype the format defines, so the header can be validated even for
// tensors we will not convert.
int DTypeBits(absl::string_view dtype) {
  static constexpr std::pair<absl::string_view, int> kBits[] = {
      {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
      {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  for (const auto& [name, bits] : kBits) {
    if (name == dtype) return bits;
  }
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Errno() { return std::strerror(errno); }

uint64_t ReadU64Le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  auto error = [&](absl::StatusCode code, absl::string_view what) {
    return absl::Status(code, absl::StrCat(path, ": ", what));
  };

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return error(
        errno == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
        absl::StrCat("cannot open: ", Errno()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string e = Errno();
    ::close(fd);
    return error(absl::StatusCode::kInternal, absl::StrCat("fstat: ", e));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return error(absl::StatusCode::kDataLoss,
                 absl::StrCat("file is ", file_size,
                              " bytes, too short for the 8-byte header length (truncated file?)"));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_error = map == MAP_FAILED ? Errno() : "";
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED)
    return error(absl::StatusCode::kInternal, absl::StrCat("mmap: ", map_error));
  f->map_ = static_cast<const uint8_t*>(map);
  f->map_size_ = file_size;

  const uint64_t header_size = ReadU64Le(f->map_);
  if (header_size > file_size - 8) {
    return error(absl::StatusCode::kDataLoss,
                 absl::StrCat("header length ", header_size, " runs past the end of the file (",
                              file_size, " bytes; truncated or not a safetensors file?)"));
  }
  if (header_size > kMaxHeaderBytes) {
    return error(absl::StatusCode::kDataLoss,
                 absl::StrCat("header length ", header_size, " exceeds the ", kMaxHeaderBytes,
                              "-byte limit (not a safetensors file?)"));
  }
  f->data_ = f->map_ + 8 + header_size;
  f->data_size_ = file_size - 8 - header_size;

  const char* header_begin = reinterpret_cast<const char*>(f->map_ + 8);
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_size);
  } catch (const Json::exception& e) {
    return error(absl::StatusCode::kDataLoss, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return error(absl::StatusCode::kDataLoss, "header is not a JSON object");

  // Not a structured binding: clang before 16 cannot capture one in tensor_error below.
  for (const auto& entry : header.items()) {
    const std::string& name = entry.key();
    const Json& value = entry.value();
    if (name == "__metadata__") {
      if (value.is_object()) {
        for (const auto& [k, v] : value.items()) {
          if (v.is_string()) f->metadata_[k] = v.get<std::string>();
        }
      }
      continue;
    }
    auto tensor_error = [&](absl::string_view what) {
      return error(absl::StatusCode::kDataLoss, absl::StrCat("tensor '", name, "' ", what));
    };
    if (!value.is_object())
      return tensor_error(absl::StrCat("entry is not an object: ", value.dump()));
    SafetensorsTensorInfo info;
    info.name = name;
    auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) return tensor_error("has no string 'dtype'");
    info.dtype_name = dtype->get<std::string>();
    info.dtype = DTypeFromSafetensorsName(info.dtype_name);
    const int bits = DTypeBits(info.dtype_name);
    if (bits == 0) return tensor_error(absl::StrCat("has unknown dtype '", info.dtype_name, "'"));

    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) return tensor_error("has no 'shape' list");
    // Elements, with an overflow guard: no real tensor comes near 2^62 elements, nor any one
    // dimension (even beside a zero, where the product stays small: shapes are int64).
    uint64_t numel = 1;
    for (const Json& d : *shape) {
      if (!d.is_number_unsigned()) {
        return tensor_error(absl::StrCat("has a bad shape ", shape->dump()));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > kMaxElements || (dim != 0 && numel > kMaxElements / dim)) {
        return tensor_error(absl::StrCat("shape ", shape->dump(), " is too large"));
      }
      numel *= dim;
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return tensor_error("has no 'data_offsets' [begin, end] pair");
    }
    info.begin = (*offsets)[0].get<uint64_t>();
    info.end = (*offsets)[1].get<uint64_t>();
    const std::string range = absl::StrCat("[", info.begin, ", ", info.end, ")");
    if (info.end < info.begin)
      return tensor_error(absl::StrCat("data_offsets ", range, " are reversed"));
    if (info.end > f->data_size_) {
      return tensor_error(absl::StrCat("data_offsets ", range, " exceed the file's ", f->data_size_,
                                       " data bytes (truncated file?)"));
    }
    // numel * bits must not wrap (numel <= 2^62, bits <= 64): the wrapped product is a small
    // byte count that a short data range could match, leaving numel far beyond the bytes.
    if (numel > std::numeric_limits<uint64_t>::max() / bits) {
      return tensor_error(
          absl::StrCat("shape ", shape->dump(), " of ", info.dtype_name, " is too large"));
    }
    const uint64_t expected_bytes = numel * bits / 8;
    if ((numel * bits) % 8 != 0 || info.end - info.begin != expected_bytes) {
      return tensor_error(absl::StrCat(
          "has shape ", ShapeString(info.shape), " of ", info.dtype_name, " (", expected_bytes,
          " bytes) but data_offsets ", range, " hold ", info.end - info.begin, " bytes"));
    }
    f->tensors_.push_back(std::move(info));
  }

  // No two tensors may share bytes.
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : f->tensors_) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& prev = *by_offset[i - 1];
    const auto& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return error(
          absl::StatusCode::kDataLoss,
          absl::StrCat("tensor '", cur.name, "' data_offsets [", cur.begin, ", ", cur.end,
                       ") overlap tensor '", prev.name, "' [", prev.begin, ", ", prev.end, ")"));
    }
  }
  std::sort(f->tensors_.begin(), f->tensors_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const SafetensorsTensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const SafetensorsTensorInfo& t, const std::string& n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::Span<const uint8_t> SafetensorsFile::RawBytes(const SafetensorsTensorInfo& info) const {
  return absl::MakeConstSpan(data_ + info.begin, info.end - info.begin);
}

absl::StatusOr<Tensor> SafetensorsFile::Read(const std::string& name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  Tensor t(info->shape);
  RETURN_IF_ERROR(ReadInto(*info, t.span()));
  return t;
}

absl::Status SafetensorsFile::ReadInto(const SafetensorsTensorInfo& info,
                                       absl::Span<float> out) const {
  if (!info.dtype.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", info.name, "' has dtype ",
                                                   info.dtype_name,
                                                   "; only F32, F16 and BF16 can be loaded"));
  }
  if (static_cast<int64_t>(out.size()) != info.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", info.name, "' has ",
                                                   info.numel(), " elements, destination holds ",
                                                   out.size()));
  }
  const DType dtype = *info.dtype;
  const uint8_t* src = data_ + info.begin;
  const size_t n = out.size();
  const size_t item = DTypeSize(dtype);
  // Big tensors convert in parallel: page-ins of the mapping and the conversion both scale.
  constexpr size_t kChunk = size_t{1} << 22;
  const size_t threads = std::min<size_t>(
      {(n + kChunk - 1) / kChunk, std::max(1u, std::thread::hardware_concurrency()), 16});
  if (threads <= 1) {
    ConvertToFloat(dtype, src, out);
    return absl::OkStatus();
  }
  std::vector<std::thread> workers;
  const size_t per = (n + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t lo = t * per;
    const size_t hi = std::min(n, lo + per);
    if (lo >= hi) break;
    workers.emplace_back([=] { ConvertToFloat(dtype, src + lo * item, out.subspan(lo, hi - lo)); });
  }
  for (auto& w : workers) w.join();
  return absl::OkStatus();
}

// ----------------------------------------------------------------------------------------------

uint64_t SafetensorsWriter::DataBytes(const std::vector<SafetensorsEntry>& entries) {
  uint64_t total = 0;
  for (const auto& e : entries) {
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    total += n * DTypeSize(e.dtype);
  }
  return total;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsEntry> entries,
    const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    if (e.name.empty() || e.name == "__metadata__" || header.contains(e.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", e.name, "' is empty, reserved or repeated"));
    }
    uint64_t n = 1;
    for (int64_t d : e.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", e.name, "' has a negative dimension"));
      }
      n *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = n * DTypeSize(e.dtype);
    header[e.name] = {{"dtype", DTypeSafetensorsName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::replace);
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->entries_ = std::move(entries);
  const std::string tmp = path + ".partial";
  w->file_ = std::fopen(tmp.c_str(), "wb");
  if (w->file_ == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(tmp, ": cannot create: ", Errno()));
  }
  std::setvbuf(w->file_, nullptr, _IOFBF, 1 << 20);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  RETURN_IF_ERROR(w->WriteBytes(len, sizeof(len)));
  RETURN_IF_ERROR(w->WriteBytes(text.data(), text.size()));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    if (!finished_) std::remove((path_ + ".partial").c_str());
  }
}

absl::Status SafetensorsWriter::WriteBytes(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    return absl::DataLossError(absl::StrCat(path_, ".partial: write failed: ", Errno()));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Append(absl::Span<const float> values) {
  if (file_ == nullptr || finished_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": writer already finished"));
  }
  while (!values.empty()) {
    while (current_ < entries_.size()) {
      const auto& e = entries_[current_];
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      if (filled_ < n) break;
      ++current_;
      filled_ = 0;
    }
    if (current_ >= entries_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": ", values.size(), " values past the last tensor"));
    }
    const auto& e = entries_[current_];
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    constexpr int64_t kBlock = 1 << 16;  // elements converted per write
    const int64_t k = std::min({n - filled_, static_cast<int64_t>(values.size()), kBlock});
    const size_t bytes = static_cast<size_t>(k) * DTypeSize(e.dtype);
    if (buffer_.size() < bytes) buffer_.resize(bytes);
    ConvertFromFloat(e.dtype, values.subspan(0, k), buffer_.data());
    RETURN_IF_ERROR(WriteBytes(buffer_.data(), bytes));
    filled_ += k;
    values.remove_prefix(k);
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (file_ == nullptr || finished_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": writer already finished"));
  }
  while (current_ < entries_.size()) {
    const auto& e = entries_[current_];
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    if (filled_ < n) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": tensor '", e.name, "' got ", filled_, " of its ", n, " values"));
    }
    ++current_;
    filled_ = 0;
  }
  const bool flushed = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  const std::string tmp = path_ + ".partial";
  if (!flushed || !closed) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat(tmp, ": write failed: ", Errno()));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    const std::string e = Errno();
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat(path_, ": rename from ", tmp, " failed: ", e));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                              DType dtype) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, dtype, t->shape()});
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> w, SafetensorsWriter::Create(path, entries));
  for (const auto& [name, t] : tensors) RETURN_IF_ERROR(w->Append(t->span()));
  return w->Finish();
}

}  // namespace treespec
