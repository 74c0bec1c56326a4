// End-to-end: `shoal serve --auth-token-file` and `--tls-*`. The real binary, spoken to
// over loopback by HTTP(S) and gRPC(-with-TLS) clients: which endpoints need the bearer
// token under each scope, that health checks never do, that TLS serves both front ends
// (and mutual TLS refuses clients without a certificate), that plain HTTP to the TLS port
// is answered rather than hung, and that bad files stop the server at start with one
// clear line.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "proto/grpc_health.grpc.pb.h"
#include "proto/grpc_service.grpc.pb.h"
#include "runtime/testing/plugin_configs.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using inference::GRPCInferenceService;
using json = nlohmann::json;
using shoal::testing::Headers;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;
using shoal::testing::TlsClientOptions;
using ::testing::HasSubstr;

constexpr char kToken[] = "e2e-token-0123456789";

std::string TlsFile(const std::string& name) {
  return SourceDir() + "/src/server/testdata/tls/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string InferJson() {
  json body = {{"inputs",
                {{{"name", "INPUT0"}, {"shape", {1, 2}}, {"datatype", "FP32"}, {"data", {1, 2}}}}}};
  return body.dump();
}

inference::ModelInferRequest InferProto() {
  inference::ModelInferRequest r;
  r.set_model_name("identity");
  auto* in = r.add_inputs();
  in->set_name("INPUT0");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(2);
  in->mutable_contents()->add_fp32_contents(1);
  in->mutable_contents()->add_fp32_contents(2);
  return r;
}

Headers Bearer(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

// A client context with a deadline and, when `token` is not empty, the bearer token.
std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "") {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

class SecurityE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.WriteFile("identity/config.pbtxt", runtime::testing::kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
    secrets_.WriteFile("token", std::string(kToken) + "\n");
    http_port_ = FreePort();
    grpc_port_ = FreePort();
  }
  void TearDown() override {
    if (HasFailure() && process_) std::cerr << "---- shoal log ----\n" << process_->log() << "\n";
  }

  std::vector<std::string> Args(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"serve",
                                     "--model-repository",
                                     repo_.path(),
                                     "--address",
                                     "127.0.0.1",
                                     "--http-port",
                                     std::to_string(http_port_),
                                     "--grpc-port",
                                     std::to_string(grpc_port_),
                                     "--allow-metrics",
                                     "false",
                                     "--backend-directory",
                                     BinaryDir() + "/backends"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Starts shoal and waits for both ports.
  void Start(std::vector<std::string> extra) {
    process_ = ShoalProcess::Start(Args(std::move(extra)));
    ASSERT_NE(process_, nullptr);
    ASSERT_TRUE(process_->WaitForPort(http_port_)) << process_->log();
    ASSERT_TRUE(process_->WaitForPort(grpc_port_)) << process_->log();
  }

  // Starts shoal expecting it to refuse: the exit status, and its log in *log.
  int StartRefused(std::vector<std::string> extra, std::string* log) {
    process_ = ShoalProcess::Start(Args(std::move(extra)));
    if (process_ == nullptr) return -1;
    const int code = process_->Wait(20000);
    *log = process_->log();
    return code;
  }

  std::string TokenFile() const { return secrets_.path() + "/token"; }

  std::unique_ptr<GRPCInferenceService::Stub> GrpcStub(
      std::shared_ptr<grpc::ChannelCredentials> creds) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(grpc_port_), creds, args);
    return GRPCInferenceService::NewStub(channel_);
  }

  static std::shared_ptr<grpc::ChannelCredentials> TlsCreds(bool client_cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadFile(TlsFile("ca.pem"));
    if (client_cert) {
      o.pem_cert_chain = ReadFile(TlsFile("client.pem"));
      o.pem_private_key = ReadFile(TlsFile("client.key"));
    }
    return grpc::SslCredentials(o);
  }

  TempDir repo_;
  TempDir secrets_;
  int http_port_ = 0;
  int grpc_port_ = 0;
  std::unique_ptr<ShoalProcess> process_;
  std::shared_ptr<grpc::Channel> channel_;
};

void ExpectUnauthorized(const HttpReply& r, bool presented) {
  EXPECT_EQ(r.status, 401) << r.body;
  const std::string* challenge = r.Header("www-authenticate");
  ASSERT_NE(challenge, nullptr);
  EXPECT_THAT(*challenge, HasSubstr("Bearer"));
  if (presented) {
    EXPECT_THAT(*challenge, HasSubstr("invalid_token"));
  }
  auto j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_EQ(j["error"].get<std::string>().find(kToken), std::string::npos);
}

TEST_F(SecurityE2eTest, HttpControlScopeGuardsOnlyModelControl) {
  Start({"--auth-token-file", TokenFile(), "--model-control-mode", "explicit", "--load-model",
         "identity"});
  HttpTestClient http("127.0.0.1", http_port_);
  ExpectUnauthorized(http.Post("/v2/repository/index", "{}"), false);
  ExpectUnauthorized(http.Post("/v2/repository/index", "{}", Bearer("wrong")), true);
  ExpectUnauthorized(http.Post("/v2/repository/models/identity/unload", "{}"), false);
  ExpectUnauthorized(http.Post("/v2/repository/models/identity/load", "{}",
                               {{"Authorization", "Basic ZTJlOnRva2Vu"}}),
                     true);
  EXPECT_EQ(http.Get("/v2/models/identity/ready").status, 200) << "nothing was unloaded";

  HttpReply index = http.Post("/v2/repository/index", "{}", Bearer(kToken));
  EXPECT_EQ(index.status, 200) << index.body;
  EXPECT_THAT(index.body, HasSubstr("identity"));
  EXPECT_EQ(http.Post("/v2/repository/models/identity/unload", "{}", Bearer(kToken)).status, 200);
  EXPECT_NE(http.Get("/v2/models/identity/ready").status, 200) << "the unload happened";
  EXPECT_EQ(http.Post("/v2/repository/models/identity/load", "{}", Bearer(kToken)).status, 200);

  // Log settings change the server for everyone: control.
  ExpectUnauthorized(http.Post("/v2/logging", R"({"log_verbose_level": 1})"), false);
  EXPECT_EQ(http.Request("GET", "/v2/logging", {}, Bearer(kToken)).status, 200);

  // Scope control: inference, shared memory, metadata and health need nothing.
  EXPECT_EQ(http.Get("/v2/systemsharedmemory/status").status, 200);
  EXPECT_EQ(http.Post("/v2/models/identity/infer", InferJson()).status, 200);
  EXPECT_EQ(http.Get("/v2/models/identity").status, 200);
  EXPECT_EQ(http.Get("/v2").status, 200);
  EXPECT_EQ(http.Get("/v2/health/live").status, 200);
  EXPECT_EQ(http.Get("/v2/health/ready").status, 200);
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, HttpAllScopeGuardsEverythingButHealth) {
  Start({"--auth-token-file", TokenFile(), "--auth-scope", "all"});
  HttpTestClient http("127.0.0.1", http_port_);
  ExpectUnauthorized(http.Post("/v2/models/identity/infer", InferJson()), false);
  ExpectUnauthorized(http.Post("/v2/models/identity/infer", InferJson(), Bearer("e2e-token")),
                     true);
  ExpectUnauthorized(http.Get("/v2/models/identity"), false);
  ExpectUnauthorized(http.Get("/v2/models/identity/config"), false);
  ExpectUnauthorized(http.Get("/v2/models/stats"), false);
  ExpectUnauthorized(http.Get("/v2"), false);
  ExpectUnauthorized(http.Post("/v2/repository/index", "{}"), false);
  ExpectUnauthorized(http.Get("/v2/systemsharedmemory/status"), false);

  HttpReply infer = http.Post("/v2/models/identity/infer", InferJson(), Bearer(kToken));
  EXPECT_EQ(infer.status, 200) << infer.body;
  EXPECT_THAT(infer.body, HasSubstr("OUTPUT0"));
  EXPECT_EQ(http.Request("GET", "/v2/models/identity", {}, Bearer(kToken)).status, 200);
  EXPECT_EQ(http.Post("/v2/repository/index", "{}", Bearer(kToken)).status, 200);

  // Load balancers and kubelets get in without a token.
  EXPECT_EQ(http.Get("/v2/health/live").status, 200);
  EXPECT_EQ(http.Get("/v2/health/ready").status, 200);
  EXPECT_EQ(http.Get("/v2/models/identity/ready").status, 200);
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, GrpcChecksTheAuthorizationMetadata) {
  Start({"--auth-token-file", TokenFile(), "--auth-scope", "all"});
  auto stub = GrpcStub(grpc::InsecureChannelCredentials());

  inference::RepositoryIndexRequest index_req;
  inference::RepositoryIndexResponse index_resp;
  EXPECT_EQ(stub->RepositoryIndex(Context().get(), index_req, &index_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub->RepositoryIndex(Context("wrong").get(), index_req, &index_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(stub->RepositoryIndex(Context(kToken).get(), index_req, &index_resp).ok());
  EXPECT_EQ(index_resp.models_size(), 1);

  inference::ModelInferResponse infer_resp;
  const grpc::Status denied = stub->ModelInfer(Context().get(), InferProto(), &infer_resp);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(denied.error_message(), HasSubstr("bearer token"));
  const grpc::Status ok = stub->ModelInfer(Context(kToken).get(), InferProto(), &infer_resp);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(infer_resp.outputs_size(), 1);

  inference::ServerMetadataRequest meta_req;
  inference::ServerMetadataResponse meta_resp;
  EXPECT_EQ(stub->ServerMetadata(Context().get(), meta_req, &meta_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // A stream without the token ends at once with UNAUTHENTICATED.
  {
    auto ctx = Context();
    auto stream = stub->ModelStreamInfer(ctx.get());
    stream->Write(InferProto());
    stream->WritesDone();
    inference::ModelStreamInferResponse r;
    EXPECT_FALSE(stream->Read(&r));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto ctx = Context(kToken);
    auto stream = stub->ModelStreamInfer(ctx.get());
    ASSERT_TRUE(stream->Write(InferProto()));
    inference::ModelStreamInferResponse r;
    ASSERT_TRUE(stream->Read(&r));
    EXPECT_TRUE(r.error_message().empty()) << r.error_message();
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }

  // Health stays open.
  inference::ServerLiveRequest live_req;
  inference::ServerLiveResponse live_resp;
  EXPECT_TRUE(stub->ServerLive(Context().get(), live_req, &live_resp).ok());
  inference::ServerReadyRequest ready_req;
  inference::ServerReadyResponse ready_resp;
  EXPECT_TRUE(stub->ServerReady(Context().get(), ready_req, &ready_resp).ok());
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest check_req;
  grpc::health::v1::HealthCheckResponse check_resp;
  EXPECT_TRUE(health->Check(Context().get(), check_req, &check_resp).ok());
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, GrpcControlScopeLeavesInferenceOpen) {
  Start({"--auth-token-file", TokenFile()});
  auto stub = GrpcStub(grpc::InsecureChannelCredentials());
  inference::ModelInferResponse infer_resp;
  EXPECT_TRUE(stub->ModelInfer(Context().get(), InferProto(), &infer_resp).ok());
  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("identity");
  inference::RepositoryModelUnloadResponse unload_resp;
  EXPECT_EQ(stub->RepositoryModelUnload(Context().get(), unload, &unload_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(stub->ModelInfer(Context().get(), InferProto(), &infer_resp).ok())
      << "the refused unload did not happen";
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, BadTokenFilesStopTheServerAtStart) {
  std::string log;
  secrets_.WriteFile("empty", "\n");
  EXPECT_EQ(StartRefused({"--auth-token-file", secrets_.path() + "/empty"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("cannot start: auth token file '" + secrets_.path() + "/empty'"));
  EXPECT_THAT(log, HasSubstr("empty"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("loading model repository")));

  EXPECT_EQ(StartRefused({"--auth-token-file", secrets_.path() + "/absent"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("cannot read the auth token file"));
}

TEST_F(SecurityE2eTest, TlsServesHttpsAndGrpcWithTheTokenOnTop) {
  Start({"--tls-cert-file", TlsFile("server.pem"), "--tls-key-file", TlsFile("server.key"),
         "--auth-token-file", TokenFile(), "--auth-scope", "all"});
  TlsClientOptions tls;
  tls.ca_file = TlsFile("ca.pem");
  HttpTestClient https("127.0.0.1", http_port_, tls);
  EXPECT_EQ(https.Get("/v2/health/ready").status, 200) << https.tls_error();
  ExpectUnauthorized(https.Post("/v2/models/identity/infer", InferJson()), false);
  HttpReply infer = https.Post("/v2/models/identity/infer", InferJson(), Bearer(kToken));
  EXPECT_EQ(infer.status, 200) << infer.body;
  EXPECT_THAT(infer.body, HasSubstr("OUTPUT0"));
  EXPECT_EQ(https.connects(), 1);

  // Plain HTTP to the HTTPS port: a plain 400 that says why, and the server goes on.
  HttpTestClient plain("127.0.0.1", http_port_);
  HttpReply refused = plain.Get("/v2/health/ready");
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(refused.body, HasSubstr("HTTPS"));
  EXPECT_EQ(https.Get("/v2/health/live").status, 200);

  auto stub = GrpcStub(TlsCreds(false));
  inference::ModelInferResponse resp;
  const grpc::Status s = stub->ModelInfer(Context(kToken).get(), InferProto(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(stub->ModelInfer(Context().get(), InferProto(), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // A plaintext gRPC client cannot talk to the TLS port.
  auto insecure = GrpcStub(grpc::InsecureChannelCredentials());
  auto ctx = Context(kToken);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  EXPECT_FALSE(insecure->ModelInfer(ctx.get(), InferProto(), &resp).ok());
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, TlsCanBeTurnedOffPerFrontEnd) {
  Start({"--tls-cert-file", TlsFile("server.pem"), "--tls-key-file", TlsFile("server.key"),
         "--grpc-use-ssl", "false"});
  TlsClientOptions tls;
  tls.ca_file = TlsFile("ca.pem");
  HttpTestClient https("127.0.0.1", http_port_, tls);
  EXPECT_EQ(https.Get("/v2/health/ready").status, 200) << https.tls_error();
  auto stub = GrpcStub(grpc::InsecureChannelCredentials());
  inference::ModelInferResponse resp;
  const grpc::Status s = stub->ModelInfer(Context().get(), InferProto(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, MutualTlsRefusesClientsWithoutACertificate) {
  // Triton's spellings for gRPC beside shoal's for both.
  Start({"--tls-cert-file", TlsFile("server.pem"), "--tls-key-file", TlsFile("server.key"),
         "--tls-ca-file", TlsFile("ca.pem"), "--grpc-use-ssl-mutual", "true", "--grpc-root-cert",
         TlsFile("ca.pem")});
  TlsClientOptions with_cert;
  with_cert.ca_file = TlsFile("ca.pem");
  with_cert.cert_file = TlsFile("client.pem");
  with_cert.key_file = TlsFile("client.key");
  HttpTestClient good("127.0.0.1", http_port_, with_cert);
  EXPECT_EQ(good.Post("/v2/models/identity/infer", InferJson()).status, 200) << good.tls_error();
  TlsClientOptions without_cert;
  without_cert.ca_file = TlsFile("ca.pem");
  HttpTestClient bad("127.0.0.1", http_port_, without_cert);
  EXPECT_EQ(bad.Get("/v2/health/ready").status, 0);

  inference::ModelInferResponse resp;
  auto good_stub = GrpcStub(TlsCreds(true));
  const grpc::Status s = good_stub->ModelInfer(Context().get(), InferProto(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  auto bad_stub = GrpcStub(TlsCreds(false));
  auto ctx = Context();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_FALSE(bad_stub->ModelInfer(ctx.get(), InferProto(), &resp).ok());
  EXPECT_EQ(process_->Terminate(), 0);
}

TEST_F(SecurityE2eTest, BadTlsFilesStopTheServerAtStartWithOneLine) {
  std::string log;
  EXPECT_EQ(
      StartRefused(
          {"--tls-cert-file", TlsFile("server.pem"), "--tls-key-file", TlsFile("other.key")}, &log),
      1);
  EXPECT_THAT(log, HasSubstr("cannot start: the TLS key file '" + TlsFile("other.key") +
                             "' does not match the certificate"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("loading model repository")));

  EXPECT_EQ(StartRefused(
                {"--tls-cert-file", TlsFile("absent.pem"), "--tls-key-file", TlsFile("server.key")},
                &log),
            1);
  EXPECT_THAT(log, HasSubstr("absent.pem"));

  // Only gRPC has TLS (Triton's flags), and its key is wrong: still refused at start.
  EXPECT_EQ(StartRefused({"--grpc-use-ssl", "true", "--grpc-server-cert", TlsFile("server.pem"),
                          "--grpc-server-key", TlsFile("other.key")},
                         &log),
            1);
  EXPECT_THAT(log, HasSubstr("does not match the certificate"));

  EXPECT_EQ(StartRefused({"--grpc-use-ssl", "true"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("gRPC TLS needs a certificate and a key"));
  EXPECT_EQ(StartRefused({"--http-use-tls", "true"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("--http-use-tls needs --tls-cert-file"));
}

}  // namespace
}  // namespace shoal::e2e
