// The `shoal` command. Subcommands: serve (serve.cc), run (run.cc), bench (bench.cc),
// worker (worker.cc), inspect (an ONNX model's summary).
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/bench.h"
#include "cli/run.h"
#include "cli/serve.h"
#include "cli/worker.h"
#ifdef SHOAL_HAVE_ONNX
#include "backends/onnx/gpu_instance.h"
#endif
#ifdef SHOAL_HAVE_ENGINE
#include "engine/inspect.h"
#include "engine/omp_wait_policy.h"
#include "engine/precision.h"
#endif

int main(int argc, char** argv) {
#ifdef SHOAL_HAVE_ENGINE
  // Before anything else: may run the program again with the engine threads' wait policy
  // set, since libgomp reads it only when it loads (engine/omp_wait_policy.h).
  shoal::engine::ExecWithOmpWaitDefault(argv);
#endif
  CLI::App app{
      "shoal: a model server for ONNX models and plugin backends, speaking the Open Inference "
      "Protocol (KServe v2) over HTTP and gRPC"};
  app.set_version_flag("--version", std::string("shoal ") + SHOAL_VERSION);
  app.set_config("--config", "",
                 "Read options from a TOML or INI file whose keys are the long flag names");
  // A misspelled key would otherwise be ignored and the server start on defaults.
  // Subcommands inherit this when they are added, so it comes first.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.require_subcommand(1);
  shoal::cli::AddServeCommand(app);
  shoal::cli::AddRunCommand(app);
  shoal::cli::AddBenchCommand(app);
  shoal::cli::AddWorkerCommand(app);

#ifdef SHOAL_HAVE_ENGINE
  std::string model_path;
  CLI::App* inspect =
      app.add_subcommand("inspect", "Summarise an ONNX model: inputs, outputs, operators, FLOPs");
  inspect->add_option("model", model_path, "Path to a .onnx file")
      ->required()
      ->check(CLI::ExistingFile);
  shoal::engine::InspectOptions inspect_options;
  inspect
      ->add_option("--batch", inspect_options.batch,
                   "Also report activation memory at this batch size (besides batch 1)")
      ->check(CLI::NonNegativeNumber);
  std::string conv_algorithm = "direct";
  inspect
      ->add_option("--conv-algorithm", conv_algorithm,
                   "How fp32 3x3 convolutions are computed: direct or winograd (as the onnx "
                   "backend's conv_algorithm parameter)")
      ->check(CLI::IsMember({"direct", "winograd"}))
      ->capture_default_str();
  std::string conv_layout = "blocked";
  inspect
      ->add_option("--conv-layout", conv_layout,
                   "The layout direct fp32 convolutions write: blocked or channels_last (as "
                   "the onnx backend's conv_layout parameter)")
      ->check(CLI::IsMember({"blocked", "channels_last"}))
      ->capture_default_str();
  inspect
      ->add_option("--profile", inspect_options.profile_runs,
                   "Also time this many runs operator by operator (at --batch, zero inputs)")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* profile = inspect->get_option("--profile");
  inspect
      ->add_option("--threads", inspect_options.profile_threads,
                   "Threads for --profile (0: all available CPUs)")
      ->check(CLI::NonNegativeNumber)
      ->needs(profile);
  inspect
      ->add_option("--stages", inspect_options.pipeline_stages,
                   "With --profile: the cut into this many pipeline stages that balances the "
                   "measured times, and its pipeline_stage_boundaries")
      ->check(CLI::PositiveNumber)
      ->needs(profile);
#ifdef SHOAL_HAVE_ONNX
  bool inspect_gpu = false;
  inspect->add_flag("--gpu", inspect_gpu,
                    "Also say what the GPU path makes of the model at --batch (or 1): whether a "
                    "KIND_GPU instance runs it whole, the nodes it lacks, where gpu_cpu_tail "
                    "would cut; needs no GPU");
#endif
  inspect->callback([&] {
    inspect_options.conv_algorithm = *shoal::engine::ParseConvAlgorithm(conv_algorithm);
    inspect_options.conv_layout = *shoal::engine::ParseConvLayout(conv_layout);
    shoal::engine::InspectSummary summary;
    auto text = shoal::engine::InspectModel(model_path, inspect_options, &summary);
    if (!text.ok()) {
      std::cerr << "shoal inspect: " << text.status().message() << "\n";
      std::exit(1);
    }
    std::cout << *text;
#ifdef SHOAL_HAVE_ONNX
    if (inspect_gpu && summary.loads) {
      auto model = shoal::engine::Model::Load(model_path);
      auto gpu = model.ok() ? shoal::backends::DescribeGpuPath(**model, inspect_options.batch)
                            : shoal::StatusOr<std::string>(model.status());
      std::cout << (gpu.ok() ? *gpu : "GPU path: " + gpu.status().message() + "\n");
    }
#endif
    // The report is printed either way; a model shoal cannot serve exits 2, so scripts
    // that gate on `shoal inspect` stop there.
    std::exit(summary.loads ? 0 : 2);
  });
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    // CLI11 words an unknown key "INI was not able to parse serve.http-prot".
    const std::string what = e.what();
    const std::string prefix = "INI was not able to parse ";
    if (what.rfind(prefix, 0) != 0) return app.exit(e);
    std::cerr << "shoal: unknown key '" << what.substr(prefix.size())
              << "' in the --config file (keys are the long option names under the "
                 "subcommand's section, e.g. [serve] http-port = 8000)\n";
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
