// How long the engine's OpenMP workers spin at the end of a parallel region before they
// sleep, and shoal's default for it.
//
// oneDNN (Debian's build) runs its primitives on libgomp. By default libgomp spins
// 300,000 iterations (milliseconds) before a waiting worker sleeps. That suits a process
// that owns its cores, not a server: the HTTP and gRPC threads, the batcher and other
// processes share the cores with the workers, a worker spinning at a barrier holds a core
// that the worker it waits for needs, and a batch that runs in under a millisecond alone
// takes 20-60 ms once the cores are busy (bench/results/slo.md). The cost model then
// learns those times and admission refuses nearly every request.
//
// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded, before main
// runs. So `shoal` and engine_benchmark call ExecWithOmpWaitDefault first thing in main:
// when the user set neither variable, it sets GOMP_SPINCOUNT and executes the program
// again, once, with the same arguments, process id and process name.
#pragma once

#include <string>

namespace shoal::engine {

// Spins before sleeping, against libgomp's 300,000: at roughly 100 spins per microsecond
// (libgomp's own estimate) it covers the gap between two operators of a run (the
// engine's dispatch takes under 2 us), not a wait for a thread that is descheduled.
// (libgomp's own short figure, used when threads outnumber CPUs, is 100, or 1000 with
// OMP_WAIT_POLICY=active.)
inline constexpr const char* kDefaultSpinCount = "1000";

// Set beside GOMP_SPINCOUNT when shoal chose it, so the log can say whose setting it is;
// across the exec it carries the process's name.
inline constexpr const char* kDefaultMarker = "SHOAL_GOMP_SPINCOUNT_DEFAULT";

// When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set: sets GOMP_SPINCOUNT to
// kDefaultSpinCount (and kDefaultMarker) and replaces the process with /proc/self/exe
// run with `argv`. Returns at once (keeping libgomp's default) when either variable was
// already set, when an affinity variable is (OMP_PROC_BIND, OMP_PLACES,
// GOMP_CPU_AFFINITY: libgomp has bound this thread to one place, and the exec would
// keep that), when the program was started through the dynamic loader, or when the exec
// failed. In the run after the exec it restores the process's name and returns.
void ExecWithOmpWaitDefault(char** argv);

struct OmpWaitPolicy {
  bool shoal_default = false;  // GOMP_SPINCOUNT is shoal's default
  std::string description;     // for the log, e.g. "GOMP_SPINCOUNT=1000 (shoal's default)"
};

// What the environment says now (libgomp read the same values when it was loaded).
OmpWaitPolicy CurrentOmpWaitPolicy();

}  // namespace shoal::engine
