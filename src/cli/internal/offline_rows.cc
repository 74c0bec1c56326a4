#include "cli/internal/offline_rows.h"

#include <simdjson.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/dtype_visit.h"
#include "core/npy.h"
#include "proto/json_writer.h"
#include "proto/tensor_json.h"

namespace shoal::cli::internal {
namespace {

// XXH3-128 of a file's bytes, fed as they are read.
class ContentHash {
 public:
  ContentHash() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~ContentHash() { XXH3_freeState(state_); }
  ContentHash(const ContentHash&) = delete;
  ContentHash& operator=(const ContentHash&) = delete;
  void Update(const void* data, size_t size) {
    bytes_ += size;
    XXH3_128bits_update(state_, data, size);
  }
  // Feeds a mapped file a megabyte at a time: the mapping is read once, here.
  void UpdateMapped(const Buffer& file) {
    constexpr size_t kChunk = size_t{1} << 20;
    const auto* p = static_cast<const char*>(file.data());
    for (size_t at = 0; at < file.size(); at += kChunk)
      Update(p + at, std::min(kChunk, file.size() - at));
  }
  uint64_t bytes() const { return bytes_; }
  std::string Hex() const {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    char out[33];
    std::snprintf(out, sizeof(out), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    return out;
  }

 private:
  XXH3_state_t* state_;
  uint64_t bytes_ = 0;
};

// Converts numeric tensors between types (numpy's float64 default into an FP32 input),
// refusing a value the model's type cannot hold (1.5 into INT64, 1e39 into FP32).
StatusOr<Tensor> ConvertTo(const Tensor& t, DataType to, const std::string& name) {
  if (t.dtype() == to) return t;
  if (!HoldsPlainValues(t.dtype()) || !HoldsPlainValues(to)) {
    return InvalidArgument("input '" + name + "' is " + std::string(DataTypeName(t.dtype())) +
                           " but the model expects " + std::string(DataTypeName(to)));
  }
  const int64_t n = t.element_count();
  Tensor out = Tensor::Allocate(to, t.shape());
  for (int64_t i = 0; i < n; ++i) {
    if (Status s = ConvertElementChecked(t.dtype(), t.data(), to, out.mutable_data(), i); !s.ok())
      return s.WithPrefix("input '" + name + "' element " + std::to_string(i));
  }
  return out;
}

// Stores JSON number `leaf` as element k of `t`, exactly for integers; INVALID_ARGUMENT
// naming the input, the element and the value when the input's type cannot hold it.
Status StoreJsonNumber(simdjson::dom::element leaf, Tensor& t, int64_t k, const std::string& name) {
  const DataType type = t.dtype();
  void* at = static_cast<char*>(t.mutable_data()) + k * static_cast<int64_t>(DataTypeSize(type));
  Status s;
  int64_t i;
  uint64_t u;
  double d;
  bool b;
  if (!leaf.get_int64().get(i)) {
    s = ConvertElementChecked(DataType::kInt64, &i, type, at, 0);
  } else if (!leaf.get_uint64().get(u)) {
    s = ConvertElementChecked(DataType::kUint64, &u, type, at, 0);
  } else if (!leaf.get_double().get(d)) {
    s = StoreElementChecked(type, at, 0, d);
  } else if (!leaf.get_bool().get(b)) {
    s = StoreElementChecked(type, at, 0, b ? 1 : 0);
  } else {
    s = InvalidArgument("is not a number");
  }
  return s.WithPrefix("input '" + name + "' element " + std::to_string(k));
}

// Shapes a row tensor ([1, ...]) for the model: drops the leading 1 when it does not batch.
Tensor ForModel(Tensor t, const runtime::ModelSignature& sig) {
  if (sig.max_batch_size > 0 || t.shape().empty()) return t;
  Shape s(t.shape().begin() + 1, t.shape().end());
  const size_t offset = static_cast<size_t>(static_cast<const char*>(t.data()) -
                                            static_cast<const char*>(t.buffer()->data()));
  return Tensor(t.dtype(), std::move(s), t.buffer(), offset, t.byte_size());
}

class ArraySource : public RowSource {
 public:
  ArraySource(runtime::ModelSignature sig, std::map<std::string, NpyArray> arrays,
              const ContentHash& hash)
      : sig_(std::move(sig)), arrays_(std::move(arrays)) {
    content_bytes_ = hash.bytes();
    content_hash_ = hash.Hex();
  }
  int64_t rows() const override { return arrays_.empty() ? 0 : arrays_.begin()->second.rows(); }
  StatusOr<std::vector<NamedTensor>> Row(int64_t i) override {
    std::vector<NamedTensor> out;
    for (const auto& [name, a] : arrays_) {
      const backends::TensorSpec* spec = nullptr;
      for (const auto& s : sig_.inputs) {
        if (s.name == name) spec = &s;
      }
      ASSIGN_OR_RETURN(Tensor t, ConvertTo(a.Row(i), spec->dtype, name));
      out.push_back({name, ForModel(std::move(t), sig_)});
    }
    return out;
  }

 private:
  runtime::ModelSignature sig_;
  std::map<std::string, NpyArray> arrays_;
};

// Flattens a JSON value into shape + leaves.
Status Flatten(simdjson::dom::element e, size_t depth, Shape* shape,
               std::vector<simdjson::dom::element>* leaves) {
  if (e.is_array()) {
    simdjson::dom::array arr = e.get_array().value_unsafe();
    const int64_t n = static_cast<int64_t>(arr.size());
    if (shape->size() == depth) {
      shape->push_back(n);
    } else if (depth >= shape->size() || (*shape)[depth] != n) {
      return InvalidArgument("nested arrays are not rectangular");
    }
    for (auto child : arr) RETURN_IF_ERROR(Flatten(child, depth + 1, shape, leaves));
    return Status::Ok();
  }
  if (depth < shape->size()) return InvalidArgument("nested arrays are not rectangular");
  leaves->push_back(e);
  return Status::Ok();
}

class JsonlSource : public RowSource {
 public:
  static StatusOr<std::unique_ptr<JsonlSource>> Open(const std::string& path,
                                                     runtime::ModelSignature sig) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return NotFound("cannot open '" + path + "': " + std::strerror(errno));
    auto src = std::unique_ptr<JsonlSource>(new JsonlSource());
    src->sig_ = std::move(sig);
    ContentHash hash;
    char chunk[1 << 16];
    for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), f)) > 0;) {
      hash.Update(chunk, n);
      src->text_.append(chunk, n);
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) return Internal("cannot read '" + path + "'");
    src->content_bytes_ = hash.bytes();
    src->content_hash_ = hash.Hex();
    size_t start = 0;
    while (start < src->text_.size()) {
      size_t end = src->text_.find('\n', start);
      if (end == std::string::npos) end = src->text_.size();
      if (src->text_.find_first_not_of(" \t\r", start) < end)
        src->lines_.emplace_back(start, end - start);
      start = end + 1;
    }
    return src;
  }
  int64_t rows() const override { return static_cast<int64_t>(lines_.size()); }
  StatusOr<std::vector<NamedTensor>> Row(int64_t i) override {
    const auto [offset, length] = lines_[static_cast<size_t>(i)];
    simdjson::dom::element doc;
    if (auto err = parser_.parse(text_.data() + offset, length).get(doc); err) {
      return InvalidArgument(std::string("invalid JSON: ") + simdjson::error_message(err));
    }
    simdjson::dom::object obj;
    if (doc.get_object().get(obj))
      return InvalidArgument("the line is not a JSON object of input names");
    std::vector<NamedTensor> out;
    for (auto field : obj) {
      const std::string name(field.key);
      const backends::TensorSpec* spec = nullptr;
      for (const auto& s : sig_.inputs) {
        if (s.name == name) spec = &s;
      }
      if (spec == nullptr) return InvalidArgument("unknown input '" + name + "'");
      Shape shape;
      std::vector<simdjson::dom::element> leaves;
      if (Status s = Flatten(field.value, 0, &shape, &leaves); !s.ok())
        return s.WithPrefix("input '" + name + "'");
      // One row: add the batch dimension unless the value already has it.
      if (shape.size() == spec->dims.size()) shape.insert(shape.begin(), 1);
      Tensor t;
      if (spec->dtype == DataType::kBytes) {
        std::vector<std::string> values;
        for (auto leaf : leaves) {
          std::string_view sv;
          if (leaf.get_string().get(sv))
            return InvalidArgument("input '" + name + "' must hold strings");
          values.emplace_back(sv);
        }
        t = Tensor::FromStrings(shape, values);
      } else if (HoldsPlainValues(spec->dtype)) {
        auto count = ElementCount(shape, int64_t{1} << 28);
        if (!count.ok()) return count.status().WithPrefix("input '" + name + "'");
        t = Tensor::Allocate(spec->dtype, shape);
        for (size_t k = 0; k < leaves.size(); ++k)
          RETURN_IF_ERROR(StoreJsonNumber(leaves[k], t, static_cast<int64_t>(k), name));
      } else {
        return InvalidArgument("input '" + name + "' has type " +
                               std::string(DataTypeName(spec->dtype)) +
                               ", which JSON lines cannot carry; use .npy/.npz");
      }
      out.push_back({name, ForModel(std::move(t), sig_)});
    }
    return out;
  }

 private:
  JsonlSource() = default;
  runtime::ModelSignature sig_;
  std::string text_;
  std::vector<std::pair<size_t, size_t>> lines_;
  simdjson::dom::parser parser_;
};

// {"shape":[...],"datatype":"FP32","data":[...]}, the data in the server's JSON encoding.
Status AppendJsonValue(std::string* out, const Tensor& t) {
  proto::JsonWriter w(out);
  w.BeginObject().Key("shape").BeginArray();
  for (int64_t d : t.shape()) w.Int(d);
  w.EndArray().Member("datatype", DataTypeName(t.dtype())).Key("data").Raw("");
  RETURN_IF_ERROR(proto::AppendTensorJsonData(t, out));
  w.EndObject();
  return Status::Ok();
}

std::string ErrorLine(int64_t i, const Status& status) {
  std::string line;
  proto::JsonWriter(&line)
      .BeginObject()
      .MemberInt("index", i)
      .Member("error", status.message())
      .EndObject();
  line.push_back('\n');
  return line;
}

class JsonlSink : public RowSink {
 public:
  static StatusOr<std::unique_ptr<JsonlSink>> Open(const std::string& path, bool append) {
    auto sink = std::unique_ptr<JsonlSink>(new JsonlSink());
    sink->file_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (sink->file_ == nullptr) return Internal("cannot write '" + path + "'");
    return sink;
  }
  ~JsonlSink() override {
    if (file_) std::fclose(file_);
  }
  // An output that JSON cannot hold (FP16, BF16, BYTES that are not UTF-8) is
  // INVALID_ARGUMENT, for the job to count as this row's failure; nothing is written.
  Status Write(int64_t i, const std::vector<NamedTensor>& outputs) override {
    std::string line;
    proto::JsonWriter w(&line);
    w.BeginObject().MemberInt("index", i).Key("outputs").BeginObject();
    for (const NamedTensor& o : outputs) {
      w.Key(o.name).Raw("");
      const Status s = AppendJsonValue(&line, o.tensor);
      if (!s.ok()) {
        return Status(s.code(),
                      "output '" + o.name + "' " + s.message() +
                          (s.code() == StatusCode::kInvalidArgument ? "; write .npy" : ""));
      }
    }
    w.EndObject().EndObject();
    line.push_back('\n');
    return Put(line);
  }
  Status WriteError(int64_t i, const Status& status) override { return Put(ErrorLine(i, status)); }

 private:
  Status Put(const std::string& line) {
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
      return Internal("cannot write the output file");
    }
    return Status::Ok();
  }
  JsonlSink() = default;
  std::FILE* file_ = nullptr;
};

std::string NpyPathFor(const std::string& path, const runtime::ModelSignature& sig,
                       const std::string& output) {
  if (sig.outputs.size() <= 1) return path;
  return path.substr(0, path.size() - 4) + "." + output + ".npy";
}

class NpySink : public RowSink {
 public:
  NpySink(std::string path, runtime::ModelSignature sig, int64_t rows, bool resume)
      : path_(std::move(path)), sig_(std::move(sig)), rows_(rows), resume_(resume) {
    // A fresh job's errors are its own, not an earlier run's.
    std::error_code ec;
    if (!resume_) std::filesystem::remove(path_ + ".errors.jsonl", ec);
  }
  Status Write(int64_t i, const std::vector<NamedTensor>& outputs) override {
    for (const auto& o : outputs) {
      auto it = writers_.find(o.name);
      if (it == writers_.end()) {
        Shape shape = o.tensor.shape();
        if (sig_.max_batch_size > 0 && !shape.empty()) shape.erase(shape.begin());
        shape.insert(shape.begin(), rows_);
        ASSIGN_OR_RETURN(auto w,
                         NpyWriter::Open(PathFor(o.name), o.tensor.dtype(), shape, resume_));
        it = writers_.emplace(o.name, std::move(w)).first;
      }
      RETURN_IF_ERROR(it->second->WriteRow(i, o.tensor.data(), o.tensor.byte_size())
                          .WithPrefix("output '" + o.name + "'"));
    }
    return Status::Ok();
  }
  Status WriteError(int64_t i, const Status& status) override {
    if (errors_ == nullptr) errors_ = std::fopen((path_ + ".errors.jsonl").c_str(), "a");
    if (errors_ == nullptr) return Internal("cannot write '" + path_ + ".errors.jsonl'");
    const std::string line = ErrorLine(i, status);
    std::fwrite(line.data(), 1, line.size(), errors_);
    std::fflush(errors_);
    return Status::Ok();
  }
  ~NpySink() override {
    if (errors_) std::fclose(errors_);
  }
  std::string PathFor(const std::string& output) const { return NpyPathFor(path_, sig_, output); }

 private:
  std::string path_;
  runtime::ModelSignature sig_;
  int64_t rows_;
  bool resume_;
  std::map<std::string, std::unique_ptr<NpyWriter>> writers_;
  std::FILE* errors_ = nullptr;
};

}  // namespace

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<std::unique_ptr<RowSource>> OpenSource(const std::string& path,
                                                const runtime::ModelSignature& sig) {
  if (EndsWith(path, ".jsonl") || EndsWith(path, ".json")) {
    ASSIGN_OR_RETURN(auto src, JsonlSource::Open(path, sig));
    return std::unique_ptr<RowSource>(std::move(src));
  }
  std::map<std::string, NpyArray> arrays;
  ContentHash hash;
  if (EndsWith(path, ".npy")) {
    if (sig.inputs.size() != 1) {
      return InvalidArgument(
          "the model has " + std::to_string(sig.inputs.size()) +
          " inputs; give them as an .npz with one array per input name, or as .jsonl");
    }
    ASSIGN_OR_RETURN(auto file, MapFile(path));
    hash.UpdateMapped(*file);
    ASSIGN_OR_RETURN(NpyArray a, ParseNpy(file, path));
    arrays.emplace(sig.inputs[0].name, std::move(a));
  } else if (EndsWith(path, ".npz")) {
    ASSIGN_OR_RETURN(auto file, MapFile(path));
    hash.UpdateMapped(*file);
    ASSIGN_OR_RETURN(auto all, ParseNpz(file, path));
    std::string names;
    for (const auto& [n, a] : all) names += (names.empty() ? "" : ", ") + n;
    for (const auto& spec : sig.inputs) {
      auto it = all.find(spec.name);
      if (it == all.end()) {
        if (spec.optional) continue;
        return InvalidArgument("'" + path + "' has no array named '" + spec.name +
                               "' (it has: " + names + ")");
      }
      arrays.emplace(spec.name, std::move(it->second));
    }
  } else {
    return InvalidArgument("input '" + path + "' must end in .npy, .npz or .jsonl");
  }
  int64_t rows = -1;
  for (const auto& [name, a] : arrays) {
    if (a.shape.empty())
      return InvalidArgument("array '" + name + "' is a scalar; rows go along the first dimension");
    if (rows >= 0 && a.rows() != rows) {
      return InvalidArgument("arrays have different row counts (" + std::to_string(rows) + " and " +
                             std::to_string(a.rows()) + " for '" + name + "')");
    }
    rows = a.rows();
  }
  return std::unique_ptr<RowSource>(new ArraySource(sig, std::move(arrays), hash));
}

std::vector<std::string> OutputFiles(const std::string& path, const runtime::ModelSignature& sig) {
  if (!EndsWith(path, ".npy")) return {path};
  std::vector<std::string> out;
  for (const auto& o : sig.outputs) out.push_back(NpyPathFor(path, sig, o.name));
  if (out.empty()) out.push_back(path);
  return out;
}

StatusOr<std::unique_ptr<RowSink>> OpenJsonlSink(const std::string& path, bool append) {
  ASSIGN_OR_RETURN(auto sink, JsonlSink::Open(path, append));
  return std::unique_ptr<RowSink>(std::move(sink));
}

std::unique_ptr<RowSink> MakeNpySink(std::string path, runtime::ModelSignature sig, int64_t rows,
                                     bool resume) {
  return std::make_unique<NpySink>(std::move(path), std::move(sig), rows, resume);
}

}  // namespace shoal::cli::internal
