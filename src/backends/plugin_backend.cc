#include "backends/plugin_backend.h"

#include <dlfcn.h>

#include <exception>
#include <filesystem>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/data_type.h"
#include "core/tensor.h"
#include "shoal/backend_api.h"

namespace shoal::backends {

// The C ABI promises these numbers; keep them in step with core.
static_assert(SHOAL_STATUS_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(SHOAL_STATUS_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(SHOAL_STATUS_FAILED_PRECONDITION ==
              static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(SHOAL_STATUS_RESOURCE_EXHAUSTED == static_cast<int>(StatusCode::kResourceExhausted));
static_assert(SHOAL_STATUS_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));
static_assert(SHOAL_STATUS_DEADLINE_EXCEEDED == static_cast<int>(StatusCode::kDeadlineExceeded));
static_assert(SHOAL_STATUS_CANCELLED == static_cast<int>(StatusCode::kCancelled));
static_assert(SHOAL_STATUS_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented));
static_assert(SHOAL_STATUS_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(SHOAL_TYPE_BOOL == static_cast<int>(DataType::kBool));
static_assert(SHOAL_TYPE_INT32 == static_cast<int>(DataType::kInt32));
static_assert(SHOAL_TYPE_INT64 == static_cast<int>(DataType::kInt64));
static_assert(SHOAL_TYPE_FP32 == static_cast<int>(DataType::kFp32));
static_assert(SHOAL_TYPE_BYTES == static_cast<int>(DataType::kBytes));
static_assert(SHOAL_TYPE_BF16 == static_cast<int>(DataType::kBf16));

namespace internal {

// An open plugin library and its resolved entry points. Immutable after Open.
struct PluginLibrary {
  std::string name;
  std::string path;
  void* handle = nullptr;
  uint32_t api_minor_version = 0;  // the minor the plugin was built against
  ShoalModelLoadFn model_load = nullptr;
  ShoalModelUnloadFn model_unload = nullptr;
  ShoalInstanceCreateFn instance_create = nullptr;
  ShoalInstanceDestroyFn instance_destroy = nullptr;
  ShoalInstanceExecuteFn instance_execute = nullptr;

  PluginLibrary() = default;
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;
  ~PluginLibrary() {
    if (handle != nullptr) dlclose(handle);
  }
};

}  // namespace internal

// Implementation details follow.
namespace {

using internal::PluginLibrary;

// Most dimensions an output may have; anything larger is a garbage rank.
constexpr uint32_t kMaxOutputRank = 64;

std::string Prefix(const PluginLibrary& library) { return "plugin '" + library.name + "'"; }

// Calls `fn(ShoalError*)` (a plugin entry point returning int) and turns a failure or an
// escaping exception into a Status "<context>: <message>".
template <typename Fn>
Status CallPlugin(const std::string& context, Fn&& fn) {
  ShoalError error;
  error.code = SHOAL_STATUS_OK;
  error.message[0] = '\0';
  error.struct_size = sizeof(ShoalError);
  int rc = 0;
  try {
    rc = fn(&error);
  } catch (const std::exception& e) {
    return Internal(context + ": threw an exception: " + e.what());
  } catch (...) {
    return Internal(context + ": threw a non-standard exception");
  }
  if (rc == 0) return Status::Ok();
  error.message[SHOAL_ERROR_MESSAGE_CAPACITY - 1] = '\0';
  const bool known_code = error.code > SHOAL_STATUS_OK && error.code <= SHOAL_STATUS_INTERNAL;
  const StatusCode code = known_code ? static_cast<StatusCode>(error.code) : StatusCode::kInternal;
  std::string message = error.message;
  if (message.empty()) {
    message = "failed without a message (returned " + std::to_string(rc) + ", code " +
              std::to_string(error.code) + ")";
  }
  return Status(code, context + ": " + message);
}

// Runs a void plugin function from a destructor, where nothing can be reported: a throwing
// release function leaks its state rather than terminating the server.
template <typename Fn>
void CallPluginNoThrow(Fn&& fn) noexcept {
  try {
    fn();
  } catch (...) {
  }
}

// Plugin model state, released when the model and all its instances are gone.
class ModelState {
 public:
  ModelState(std::shared_ptr<const PluginLibrary> library, void* state)
      : library_(std::move(library)), state_(state) {}
  ~ModelState() {
    CallPluginNoThrow([&] { library_->model_unload(state_); });
  }
  ModelState(const ModelState&) = delete;
  ModelState& operator=(const ModelState&) = delete;

  const PluginLibrary& library() const { return *library_; }
  void* state() const { return state_; }

 private:
  std::shared_ptr<const PluginLibrary> library_;
  void* const state_;
};

// The allocate_output callback's context for one execution.
class OutputCollector {
 public:
  OutputCollector(const PluginLibrary& library, int64_t batch_size, bool batching)
      : library_(library), batch_size_(batch_size), batching_(batching) {}

  // The C callback. Never throws: it is called from plugin frames.
  static void* Allocate(void* ctx, const char* name, int32_t datatype, const int64_t* shape,
                        uint32_t rank, uint64_t byte_size) noexcept {
    if (ctx == nullptr) return nullptr;
    auto* self = static_cast<OutputCollector*>(ctx);
    const char* output = name == nullptr ? "" : name;
    try {
      StatusOr<void*> data = self->AllocateOrError(output, datatype, shape, rank, byte_size);
      if (data.ok()) return *data;
      self->RecordError(data.status());
    } catch (const std::exception& e) {
      self->RecordError(self->OutputError(output, std::string("allocation failed: ") + e.what()));
    } catch (...) {
      self->RecordError(self->OutputError(output, "allocation failed"));
    }
    return nullptr;
  }

  // The first allocation error, OK when none.
  const Status& error() const { return error_; }

  // Checks what the plugin wrote, after a successful execute.
  Status Validate(const std::vector<std::string>& required) const {
    for (const NamedTensor& out : outputs_) {
      if (out.tensor.dtype() != DataType::kBytes) continue;
      Status scan = ScanBytesElements(out.tensor.bytes(), out.tensor.element_count()).status();
      if (!scan.ok()) return OutputError(out.name, "malformed BYTES data: " + scan.message());
    }
    for (const std::string& name : required) {
      if (Find(name) == nullptr) return OutputError(name, "was requested but not produced");
    }
    return Status::Ok();
  }

  std::vector<NamedTensor> TakeOutputs() { return std::move(outputs_); }

 private:
  Status OutputError(const std::string& output, const std::string& what) const {
    return Internal(Prefix(library_) + ": output '" + output + "' " + what);
  }

  void RecordError(Status status) {
    if (error_.ok()) error_ = std::move(status);
  }

  const NamedTensor* Find(const std::string& name) const {
    for (const NamedTensor& out : outputs_) {
      if (out.name == name) return &out;
    }
    return nullptr;
  }

  StatusOr<void*> AllocateOrError(const std::string& output, int32_t datatype, const int64_t* shape,
                                  uint32_t rank, uint64_t byte_size) {
    if (output.empty()) return OutputError(output, "has no name");
    if (Find(output) != nullptr) return OutputError(output, "was allocated twice");
    if (datatype <= SHOAL_TYPE_INVALID || datatype > SHOAL_TYPE_BF16) {
      return OutputError(output, "has unknown datatype " + std::to_string(datatype));
    }
    const auto dtype = static_cast<DataType>(datatype);
    if (rank > kMaxOutputRank) {
      return OutputError(output, "has rank " + std::to_string(rank) + ", more than " +
                                     std::to_string(kMaxOutputRank));
    }
    if (rank > 0 && shape == nullptr) return OutputError(output, "has a null shape");
    Shape dims(shape, shape + rank);
    if (byte_size > PluginBackend::kMaxOutputBytes) {
      return OutputError(output, "asks for " + std::to_string(byte_size) + " bytes, more than " +
                                     std::to_string(PluginBackend::kMaxOutputBytes));
    }
    // Fixed-size types need exactly size * count bytes; BYTES needs at least a 4-byte
    // length per element.
    const bool bytes_type = dtype == DataType::kBytes;
    const uint64_t element_bytes = bytes_type ? 4 : DataTypeSize(dtype);
    StatusOr<int64_t> count =
        ElementCount(dims, static_cast<int64_t>(PluginBackend::kMaxOutputBytes / element_bytes));
    if (!count.ok()) return OutputError(output, "has a bad shape: " + count.status().message());
    const uint64_t needed = static_cast<uint64_t>(*count) * element_bytes;
    if (bytes_type ? byte_size < needed : byte_size != needed) {
      return OutputError(output, "has byte size " + std::to_string(byte_size) + ", but shape " +
                                     ShapeToString(dims) + " of " +
                                     std::string(DataTypeName(dtype)) + " needs " +
                                     (bytes_type ? "at least " : "") + std::to_string(needed));
    }
    if (batching_ && (dims.empty() || dims[0] != batch_size_)) {
      return OutputError(output, "has shape " + ShapeToString(dims) +
                                     ", but a batched output's first dimension must be the "
                                     "batch size " +
                                     std::to_string(batch_size_));
    }
    Tensor tensor = Tensor::Allocate(dtype, std::move(dims), static_cast<size_t>(byte_size));
    void* data = tensor.mutable_data();
    outputs_.push_back(NamedTensor{output, std::move(tensor)});
    return data;
  }

  const PluginLibrary& library_;
  const int64_t batch_size_;
  const bool batching_;
  std::vector<NamedTensor> outputs_;
  Status error_;
};

class PluginInstance final : public BackendInstance {
 public:
  PluginInstance(std::shared_ptr<const ModelState> model, void* state, int max_batch_size,
                 std::vector<std::string> model_outputs)
      : model_(std::move(model)),
        state_(state),
        batching_(max_batch_size > 0),
        model_outputs_(std::move(model_outputs)) {}
  ~PluginInstance() override {
    CallPluginNoThrow([&] { model_->library().instance_destroy(state_); });
  }

  Status Execute(const ExecuteRequest& request, std::vector<NamedTensor>* outputs) override {
    const PluginLibrary& library = model_->library();
    std::vector<ShoalTensor> inputs;
    inputs.reserve(request.inputs.size());
    for (const NamedTensor& in : request.inputs) {
      inputs.push_back(ShoalTensor{in.name.c_str(), static_cast<int32_t>(in.tensor.dtype()),
                                   in.tensor.shape().data(),
                                   static_cast<uint32_t>(in.tensor.shape().size()),
                                   in.tensor.data(), in.tensor.byte_size()});
    }
    std::vector<const char*> requested;
    requested.reserve(request.requested_outputs.size());
    for (const std::string& name : request.requested_outputs) requested.push_back(name.c_str());

    OutputCollector collector(library, request.batch_size, batching_);
    ShoalExecuteArgs args{};
    args.batch_size = request.batch_size;
    args.inputs = inputs.data();
    args.input_count = static_cast<uint32_t>(inputs.size());
    args.requested_outputs = requested.data();
    args.requested_output_count = static_cast<uint32_t>(requested.size());
    args.allocate_output = &OutputCollector::Allocate;
    args.allocate_output_ctx = &collector;
    args.struct_size = sizeof(ShoalExecuteArgs);

    Status status = CallPlugin(Prefix(library), [&](ShoalError* error) {
      return library.instance_execute(state_, &args, error);
    });
    if (!collector.error().ok()) {
      // The rejected allocation is the root cause; keep what the plugin said after it.
      if (status.ok()) return collector.error();
      return Internal(collector.error().message() +
                      " (then the plugin reported: " + status.message() + ")");
    }
    RETURN_IF_ERROR(status);
    RETURN_IF_ERROR(collector.Validate(
        request.requested_outputs.empty() ? model_outputs_ : request.requested_outputs));
    for (NamedTensor& out : collector.TakeOutputs()) outputs->push_back(std::move(out));
    return Status::Ok();
  }

 private:
  const std::shared_ptr<const ModelState> model_;
  void* const state_;
  const bool batching_;
  // The outputs the model's config declares: what "all outputs" means.
  const std::vector<std::string> model_outputs_;
};

// Views of a ModelInfo as the C structs; valid while the ModelInfo is.
class CModelInfo {
 public:
  explicit CModelInfo(const ModelInfo& info) {
    inputs_ = Specs(info.inputs);
    outputs_ = Specs(info.outputs);
    for (const auto& [key, value] : info.parameters) {
      parameters_.push_back(ShoalParameter{key.c_str(), value.c_str()});
    }
    c_.name = info.name.c_str();
    c_.version = info.version;
    c_.model_dir = info.model_dir.c_str();
    c_.version_dir = info.version_dir.c_str();
    c_.max_batch_size = info.max_batch_size;
    c_.inputs = inputs_.data();
    c_.input_count = static_cast<uint32_t>(inputs_.size());
    c_.outputs = outputs_.data();
    c_.output_count = static_cast<uint32_t>(outputs_.size());
    c_.parameters = parameters_.data();
    c_.parameter_count = static_cast<uint32_t>(parameters_.size());
    c_.struct_size = sizeof(ShoalModelInfo);
  }
  const ShoalModelInfo* get() const { return &c_; }

 private:
  static std::vector<ShoalTensorSpec> Specs(const std::vector<TensorSpec>& specs) {
    std::vector<ShoalTensorSpec> out;
    out.reserve(specs.size());
    for (const TensorSpec& s : specs) {
      out.push_back(ShoalTensorSpec{s.name.c_str(), static_cast<int32_t>(s.dtype), s.dims.data(),
                                    static_cast<uint32_t>(s.dims.size()), s.optional ? 1 : 0});
    }
    return out;
  }

  std::vector<ShoalTensorSpec> inputs_;
  std::vector<ShoalTensorSpec> outputs_;
  std::vector<ShoalParameter> parameters_;
  ShoalModelInfo c_{};
};

class PluginModel final : public BackendModel {
 public:
  PluginModel(std::shared_ptr<const ModelState> state, ModelInfo info)
      : state_(std::move(state)), info_(std::move(info)) {
    for (const TensorSpec& spec : info_.outputs) output_names_.push_back(spec.name);
  }

  StatusOr<std::unique_ptr<BackendInstance>> CreateInstance(const InstanceInfo& info) override {
    const PluginLibrary& library = state_->library();
    // The plugin API has no device in its instance info: a plugin runs where its thread is.
    if (info.gpu >= 0) {
      return InvalidArgument(Prefix(library) + " cannot create instance '" + info.name +
                             "' on GPU " + std::to_string(info.gpu) +
                             ": plugin backends run KIND_CPU instances only");
    }
    const std::vector<int32_t> cores(info.cpu_cores.begin(), info.cpu_cores.end());
    ShoalInstanceInfo c_info{};
    c_info.name = info.name.c_str();
    c_info.index = info.index;
    c_info.cpu_cores = cores.data();
    c_info.cpu_core_count = static_cast<uint32_t>(cores.size());
    c_info.struct_size = sizeof(ShoalInstanceInfo);
    void* instance_state = nullptr;
    RETURN_IF_ERROR(CallPlugin(
        Prefix(library) + " could not create instance '" + info.name + "'", [&](ShoalError* error) {
          return library.instance_create(state_->state(), &c_info, &instance_state, error);
        }));
    return std::unique_ptr<BackendInstance>(std::make_unique<PluginInstance>(
        state_, instance_state, info_.max_batch_size, output_names_));
  }

  ModelInfo info() const override { return info_; }

 private:
  const std::shared_ptr<const ModelState> state_;
  const ModelInfo info_;
  std::vector<std::string> output_names_;
};

std::string VersionString(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

template <typename Fn>
StatusOr<Fn> Resolve(const PluginLibrary& library, const char* symbol) {
  dlerror();  // clear any stale error
  void* address = dlsym(library.handle, symbol);
  if (address == nullptr) {
    return FailedPrecondition(
        "plugin library '" + library.path + "' for backend '" + library.name +
        "' does not export " + symbol +
        " (define it with extern \"C\" and SHOAL_BACKEND_EXPORT from shoal/backend_api.h)");
  }
  return reinterpret_cast<Fn>(address);
}

}  // namespace

StatusOr<std::shared_ptr<Backend>> PluginBackend::Open(const std::string& name,
                                                       const std::string& library_path) {
  std::error_code ec;
  // An absolute path, so that dlopen never searches LD_LIBRARY_PATH for a bare file name.
  const std::filesystem::path path = std::filesystem::absolute(library_path, ec);
  if (ec || !std::filesystem::is_regular_file(path, ec)) {
    return NotFound("plugin library '" + library_path + "' for backend '" + name +
                    "' does not exist");
  }
  auto library = std::make_shared<PluginLibrary>();
  library->name = name;
  library->path = path.string();
  library->handle = dlopen(library->path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library->handle == nullptr) {
    const char* why = dlerror();
    return FailedPrecondition("cannot load plugin library '" + library->path + "' for backend '" +
                              name + "': " + (why != nullptr ? why : "unknown dlopen error"));
  }

  // The version first: a plugin from another API version may miss or mistype the rest.
  ASSIGN_OR_RETURN(auto api_version,
                   Resolve<ShoalBackendApiVersionFn>(*library, "shoal_backend_api_version"));
  uint32_t packed = 0;
  RETURN_IF_ERROR(CallPlugin(Prefix(*library), [&](ShoalError*) {
    packed = api_version();
    return 0;
  }));
  // SHOAL_BACKEND_API_MAKE_VERSION's layout; a 1.0 plugin's plain 1 reads as 1.0.
  const uint32_t major = packed & 0xffffu;
  const uint32_t minor = packed >> 16;
  if (major != SHOAL_BACKEND_API_VERSION) {
    return FailedPrecondition(
        "plugin library '" + library->path + "' for backend '" + name +
        "' was built for backend API version " + VersionString(major, minor) +
        ", but this server implements version " +
        VersionString(SHOAL_BACKEND_API_VERSION, SHOAL_BACKEND_API_VERSION_MINOR) +
        " and loads plugins of major version " + std::to_string(SHOAL_BACKEND_API_VERSION) +
        " only; rebuild it against this server's shoal/backend_api.h");
  }
  // Any minor loads: struct_size tells an older or newer plugin which fields are there.
  library->api_minor_version = minor;
  ASSIGN_OR_RETURN(library->model_load, Resolve<ShoalModelLoadFn>(*library, "shoal_model_load"));
  ASSIGN_OR_RETURN(library->model_unload,
                   Resolve<ShoalModelUnloadFn>(*library, "shoal_model_unload"));
  ASSIGN_OR_RETURN(library->instance_create,
                   Resolve<ShoalInstanceCreateFn>(*library, "shoal_instance_create"));
  ASSIGN_OR_RETURN(library->instance_destroy,
                   Resolve<ShoalInstanceDestroyFn>(*library, "shoal_instance_destroy"));
  ASSIGN_OR_RETURN(library->instance_execute,
                   Resolve<ShoalInstanceExecuteFn>(*library, "shoal_instance_execute"));
  return std::shared_ptr<Backend>(new PluginBackend(std::move(library)));
}

PluginBackend::PluginBackend(std::shared_ptr<const internal::PluginLibrary> library)
    : library_(std::move(library)) {}

std::string PluginBackend::name() const { return library_->name; }

const std::string& PluginBackend::library_path() const { return library_->path; }

uint32_t PluginBackend::api_minor_version() const { return library_->api_minor_version; }

StatusOr<std::unique_ptr<BackendModel>> PluginBackend::LoadModel(const ModelInfo& info) {
  const CModelInfo c_info(info);
  void* model_state = nullptr;
  RETURN_IF_ERROR(CallPlugin(
      Prefix(*library_) + " could not load model '" + info.name + "' version " +
          std::to_string(info.version),
      [&](ShoalError* error) { return library_->model_load(c_info.get(), &model_state, error); }));
  auto state = std::make_shared<const ModelState>(library_, model_state);
  return std::unique_ptr<BackendModel>(std::make_unique<PluginModel>(std::move(state), info));
}

}  // namespace shoal::backends
