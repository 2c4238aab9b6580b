// fbjax's CPU kernels (cpu_kernels.cc, cpu_attention.cc): the work splitting they share.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace fbjax_cpu {

// Runs f(c) for c in [0, n): the calling thread and up to (threads - 1) tasks
// on XLA's intra-op pool claim chunks from one counter. The caller waits only
// for chunks some running thread has claimed, so a pool that never gets to
// our task cannot block it (the late task finds no chunk and returns).
template <class F>
void ParallelChunks(xla::ffi::ThreadPool& pool, int64_t n, const F& f) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto st = std::make_shared<State>();
  auto work = [st, n, f]() {
    for (int64_t c = st->next.fetch_add(1); c < n; c = st->next.fetch_add(1)) {
      f(c);
      st->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n) - 1;
  for (int64_t t = 0; t < helpers; ++t) {
    auto task = work;  // Schedule takes ownership of a copy
    pool.Schedule(std::move(task));
  }
  work();
  while (st->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

}  // namespace fbjax_cpu
