// Clang thread-safety annotations: which mutex guards which member, and which functions
// expect a lock held, checked by the compiler (-Wthread-safety) rather than by comments.
//
// Under Clang the macros expand to the attributes documented at
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html; under every other compiler
// (the main build is GCC) they expand to nothing, so they cost nothing at run time.
// scripts/test.sh compiles the whole tree once with clang -Wthread-safety
// -Werror=thread-safety (scripts/check_thread_safety.sh).
//
// The standard library's std::mutex and std::lock_guard carry no annotations in
// libstdc++, so the analysis cannot see them: guarded state uses shoal::Mutex,
// shoal::MutexLock and shoal::CondVar (core/mutex.h) instead.
//
//   class Queue {
//    public:
//     void Push(int v) EXCLUDES(mu_) { MutexLock lock(&mu_); PushLocked(v); }
//    private:
//     void PushLocked(int v) REQUIRES(mu_);
//     Mutex mu_;
//     std::deque<int> items_ GUARDED_BY(mu_);
//   };
#pragma once

// Abseil's legacy absl/base/internal/thread_annotations.h (included through gRPC's
// headers) defines GUARDED_BY, PT_GUARDED_BY, ACQUIRED_BEFORE, ACQUIRED_AFTER and
// NO_THREAD_SAFETY_ANALYSIS with the same meaning; whichever header comes first defines
// them, so either include order compiles without redefinition warnings.

#if defined(__clang__)
#define SHOAL_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define SHOAL_THREAD_ANNOTATION_(x)
#endif

// A class whose objects are capabilities (locks); `x` names the kind in diagnostics.
#define CAPABILITY(x) SHOAL_THREAD_ANNOTATION_(capability(x))
// An RAII class that holds a capability for its lifetime.
#define SCOPED_CAPABILITY SHOAL_THREAD_ANNOTATION_(scoped_lockable)

// A data member that may only be read or written with `x` held.
#ifndef GUARDED_BY
#define GUARDED_BY(x) SHOAL_THREAD_ANNOTATION_(guarded_by(x))
#endif
// A pointer (or smart pointer) member whose pointee may only be touched with `x` held.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) SHOAL_THREAD_ANNOTATION_(pt_guarded_by(x))
#endif

// Lock order: this mutex is always taken before (after) the listed ones.
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) SHOAL_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) SHOAL_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#endif

// The caller must hold (must not hold) the listed capabilities.
#define REQUIRES(...) SHOAL_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) SHOAL_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) SHOAL_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// The function acquires (releases) the listed capabilities, or `this` when none is named.
#define ACQUIRE(...) SHOAL_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) SHOAL_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
// The function acquires the capability when it returns `x` (e.g. TryLock).
#define TRY_ACQUIRE(...) SHOAL_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
// Tells the analysis the capability is held here (a run-time check in debug builds).
#define ASSERT_CAPABILITY(x) SHOAL_THREAD_ANNOTATION_(assert_capability(x))
// The function returns a reference to the named capability.
#define RETURN_CAPABILITY(x) SHOAL_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function. Use only with a comment saying why the
// pattern is safe and why it cannot be expressed with the annotations above.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS SHOAL_THREAD_ANNOTATION_(no_thread_safety_analysis)
#endif
