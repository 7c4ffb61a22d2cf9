// A weight product for decoding on XLA:CPU: y[M, N] = x[M, K] @ W[K, N] with W
// stored as [N / P, K, P] panels of P = SpecdecPanelWidth() columns (see panel_dot.py).
//
// One decoding step multiplies a few rows (batch x chunk length) by every weight
// matrix once, so it is bound by reading the weights.  The panels are float32, or
// float16 widened to float32 in registers (half the bytes to read; `pack` stores
// float16 only where it holds every weight exactly).  A panel is one contiguous
// walk down K for P output columns, P = two vector registers of columns with
// AVX2 (16 registers), four with AVX-512 (32): wide enough that each broadcast
// of x feeds several FMAs.  Up to kGroupRows (6) rows' sums of a whole panel stay
// in registers, so the panel streams from memory in one pass.  7 to kHalfRows
// (14) rows take the panel's column halves one after the other, block by block
// of kBlock K-rows: each half holds every row's sums, the first walk prefetches
// the whole block and the second finds it in L1, so each weight is read from
// memory and widened once and multiplied by every row (a verification of up to
// 14 tokens is one pass over the weights).  More rows go through in groups of
// equal size, each group a pass over the block in L1.  The panels are shared
// between the calling thread and helper threads of our own, as many as XLA's
// intra-op pool has beyond it (`Helper`: awake between the products of a step).
// Written with GCC vector extensions for the widest vectors -march=native enables.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
constexpr int kWidth = 16;  // Floats per vector register.
constexpr int kRegisters = 32;
#elif defined(__AVX__)
constexpr int kWidth = 8;
constexpr int kRegisters = 16;
#else
constexpr int kWidth = 4;  // SSE, NEON.
constexpr int kRegisters = 16;
#endif

typedef float vec __attribute__((vector_size(kWidth * 4)));
typedef float vecu __attribute__((vector_size(kWidth * 4), aligned(4)));  // Unaligned access.

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// kWidth weights of a panel row as floats: a float32 load, or float16 widened.
inline vec Load(const float* w) { return vec(*reinterpret_cast<const vecu*>(w)); }

inline vec Load(const uint16_t* w) {
#if defined(__AVX512F__)
  return vec(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))));
#elif defined(__F16C__) && defined(__AVX__)
  return vec(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
#else
  vec out;
  for (int j = 0; j < kWidth; ++j) out[j] = static_cast<float>(*reinterpret_cast<const _Float16*>(w + j));
  return out;
#endif
}

constexpr int kVectors = kRegisters / 8;        // Vectors per panel row: 2 or 4.
constexpr int64_t kPanel = kVectors * kWidth;   // Output columns per panel.
constexpr int kHalf = kVectors / 2;             // Vectors per column half of a panel.
// Rows per pass over V vectors of columns: R x V sums + V weights + 1 broadcast.
constexpr int RowsFor(int vectors) { return (kRegisters - vectors - 1) / vectors; }
constexpr int kGroupRows = RowsFor(kVectors);   // 6 either way.
constexpr int kHalfRows = RowsFor(kHalf);       // 14 either way.
constexpr int64_t kBlock = 64;                  // K-rows per block of a panel (<= 16 KB).
constexpr int64_t kAhead = 128;                 // K-rows a panel walk prefetches ahead.
constexpr int64_t kLine = 64;                   // Bytes per cache line.
constexpr int64_t kMinChunkBytes = 1 << 16;     // Less weight than this stays on one thread.
constexpr int64_t kSpinNs = 200000;             // A helper's wait for the next chunk awake.

// Touches `lines` cache lines of the panel row kAhead K-rows ahead of `panel_row`:
// the hardware prefetchers alone leave a panel walk short of the memory's
// bandwidth once a few rows' FMAs sit between its loads.
template <typename W>
inline void Prefetch(const W* panel_row, int64_t lines) {
  const char* ahead = reinterpret_cast<const char*>(panel_row + kAhead * kPanel);
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(ahead + l * kLine);
}

// Cache lines per panel row.
template <typename W>
constexpr int64_t kRowLines = (kPanel * static_cast<int64_t>(sizeof(W)) + kLine - 1) / kLine;

// y[r, col:col + V * kWidth] (+)= x[r, k0:k1] @ panel[k0:k1, v0 * kWidth:...] for R
// rows, V of the panel's kVectors vectors from vector v0; x is [R, K] with row
// stride K, y [R, N]; the first block (k0 == 0) starts from 0.  The first (or
// only) slice of a panel prefetches whole panel rows ahead; a later one finds
// its block in L1.
template <int R, int V, typename W>
inline void Block(const float* x, const W* panel, float* y, int64_t k, int64_t n,
                  int64_t col, int64_t v0, int64_t k0, int64_t k1) {
  vec acc[R][V];
  const int64_t prefetch = v0 == 0 ? kRowLines<W> : 0;
  const int64_t out = col + v0 * kWidth;
  for (int r = 0; r < R; ++r) {
    const vecu* sums = reinterpret_cast<const vecu*>(y + r * n + out);
    for (int j = 0; j < V; ++j) acc[r][j] = k0 == 0 ? vec{} : vec(sums[j]);
  }
  for (int64_t i = k0; i < k1; ++i) {
    const W* w = panel + i * kPanel;
    Prefetch(w, prefetch);
    vec wv[V];
    for (int j = 0; j < V; ++j) {
      vec loaded = Load(w + (v0 + j) * kWidth);
      // In a register, loaded once for all R rows (not folded into each row's FMA).
      if constexpr (R > 1) __asm__("" : "+v"(loaded));
      wv[j] = loaded;
    }
    for (int r = 0; r < R; ++r) {
      const float s = x[r * k + i];
      for (int j = 0; j < V; ++j) acc[r][j] += s * wv[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    vecu* sums = reinterpret_cast<vecu*>(y + r * n + out);
    for (int j = 0; j < V; ++j) sums[j] = acc[r][j];
  }
}

// Calls F<R>() for R = rows, one of 1..Max (a compile-time count of rows).
template <int Max, typename F>
inline void WithRows(int64_t rows, F&& f) {
  if constexpr (Max > 1) {
    if (rows < Max) return WithRows<Max - 1>(rows, f);
  }
  f(std::integral_constant<int, Max>{});
}

// One block of a panel for `rows` (1..kHalfRows) rows: the whole panel width in one
// walk for up to kGroupRows rows, its two column halves one after the other for more.
template <typename W>
void GroupBlock(int64_t rows, const float* x, const W* panel, float* y, int64_t k,
                int64_t n, int64_t col, int64_t k0, int64_t k1) {
  if (rows <= kGroupRows) {
    WithRows<kGroupRows>(rows, [&](auto r) {
      Block<decltype(r)::value, kVectors>(x, panel, y, k, n, col, 0, k0, k1);
    });
  } else {
    WithRows<kHalfRows>(rows, [&](auto r) {
      if constexpr (decltype(r)::value > kGroupRows) {
        Block<decltype(r)::value, kHalf>(x, panel, y, k, n, col, 0, k0, k1);
        Block<decltype(r)::value, kHalf>(x, panel, y, k, n, col, kHalf, k0, k1);
      }
    });
  }
}

// Panels [p0, p1) for all m rows: up to kGroupRows in one walk over each panel, up
// to kHalfRows block by block in one pass, more in groups of equal size per block.
template <typename W>
void Panels(const float* x, const W* w, float* y, int64_t m, int64_t k, int64_t n,
            int64_t p0, int64_t p1) {
  const int64_t groups = (m + kHalfRows - 1) / kHalfRows;
  const int64_t block = m <= kGroupRows ? k : kBlock;
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = w + p * k * kPanel;
    const int64_t col = p * kPanel;
    for (int64_t k0 = 0; k0 < k; k0 += block) {
      const int64_t k1 = std::min(k, k0 + block);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t r0 = m * g / groups, r1 = m * (g + 1) / groups;
        GroupBlock(r1 - r0, x + r0 * k, panel, y + r0 * n, k, n, col, k0, k1);
      }
    }
  }
}

// Chunks of panels, claimed by whichever thread comes first.  The caller claims
// too and then waits only for chunks already being computed, so the product
// finishes even if no pool thread ever starts (the pool may be busy); a pool
// task that starts late finds nothing left and returns.  Shared by pointer so
// such a task never reads a finished call's stack.
template <typename W>
struct Job {
  const float* x;
  const W* w;
  float* y;
  int64_t m, k, n, panels, chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      Panels(x, w, y, m, k, n, panels * c / chunks, panels * (c + 1) / chunks);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Threads of our own that take a call's chunks beside the caller.  A decoder step
// is some forty products of 0.3-3 MB, a few microseconds each, with XLA's
// single-threaded ops between them; a pool thread woken per call (a futex wake,
// tens of microseconds) arrives after most of the product is done, so a step
// ran at about one core's bandwidth.  A helper instead spins for kSpinNs after
// each chunk it took, so it is awake for the next product of the same step,
// and sleeps once the decoder has stopped calling.
class Helper {
 public:
  using Task = std::function<void()>;

  // Hands `task` to this helper; false if it still holds another (the caller
  // then gives it to XLA's pool).
  bool Offer(Task task) {
    auto* boxed = new Task(std::move(task));
    Task* expected = nullptr;
    if (!slot_.compare_exchange_strong(expected, boxed)) {
      delete boxed;
      return false;
    }
    if (sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_one();
    }
    return true;
  }

  // Starts the thread; the helpers live as long as the process.
  void Start() { std::thread([this] { Loop(); }).detach(); }

 private:
  void Loop() {
    for (;;) {
      Task* task = Take();
      (*task)();
      delete task;
    }
  }

  Task* Take() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kSpinNs);
    for (int i = 0;; ++i) {
      if (Task* task = slot_.exchange(nullptr)) return task;
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      Pause();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    // Set before looking at the slot again: an Offer that missed the flag
    // filled the slot before this look (both sequentially consistent).
    sleeping_.store(true);
    Task* task;
    wake_.wait(lock, [&] { return (task = slot_.exchange(nullptr)) != nullptr; });
    sleeping_.store(false);
    return task;
  }

  std::atomic<Task*> slot_{nullptr};
  std::atomic<bool> sleeping_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

// The helpers, started on first use: one per thread of XLA's pool beyond the
// caller's, at most one per other core.
Helper* Helpers(int64_t wanted, int64_t* count) {
  static const int64_t n = std::max<int64_t>(
      0, std::min<int64_t>(wanted, std::thread::hardware_concurrency()) - 1);
  static Helper* helpers = [] {
    auto* made = new Helper[n];
    for (int64_t i = 0; i < n; ++i) made[i].Start();
    return made;
  }();
  *count = n;
  return helpers;
}

template <ffi::DataType T>
ffi::Error PanelDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  using W = std::conditional_t<T == ffi::F32, float, uint16_t>;
  const auto dims = w.dimensions();
  if (dims.size() != 3 || dims[2] != kPanel) {
    return ffi::Error::InvalidArgument("panel_dot: weights must be [N / P, K, P] panels, "
                                       "P = SpecdecPanelWidth()");
  }
  const int64_t panels = dims[0], k = dims[1], n = panels * kPanel;
  if (k == 0 || x.element_count() % k != 0 || y->element_count() != x.element_count() / k * n) {
    return ffi::Error::InvalidArgument("panel_dot: x must be [..., K] and y [..., N]");
  }
  auto job = std::make_shared<Job<W>>();
  job->x = x.typed_data();
  job->w = reinterpret_cast<const W*>(w.untyped_data());
  job->y = y->typed_data();
  job->m = x.element_count() / k;
  job->k = k;
  job->n = n;
  job->panels = panels;
  const int64_t bytes = panels * k * kPanel * static_cast<int64_t>(sizeof(W));
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(pool.num_threads(), bytes / kMinChunkBytes));
  job->chunks = std::min<int64_t>(panels, 4 * threads);
  int64_t count;
  Helper* helpers = Helpers(pool.num_threads(), &count);
  for (int64_t t = 1; t < threads; ++t) {
    if (t > count || !helpers[t - 1].Offer([job] { job->Work(); })) {
      pool.Schedule([job] { job->Work(); });
    }
  }
  job->Work();
  while (job->done.load(std::memory_order_acquire) < job->chunks) Pause();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelDot, PanelDot<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The same product over float16 panels.
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelDotF16, PanelDot<ffi::F16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The panel width P this build multiplies (panel_dot.py packs weights to it).
extern "C" int64_t SpecdecPanelWidth() { return kPanel; }
