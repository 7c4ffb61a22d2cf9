// A weight product for decoding on XLA:CPU: y[M, N] = x[M, K] @ W[K, N] with W
// stored as [N / P, K, P] panels of P = SpecdecPanelWidth() columns (see panel_dot.py).
//
// One decoding step multiplies a few rows (batch x chunk length) by every weight
// matrix once, so it is bound by reading the weights.  The panels are float32, or
// float16 widened to float32 in registers (half the bytes to read; `pack` stores
// float16 only where it holds every weight exactly).  A panel is one contiguous
// walk down K for P output columns, P = two vector registers of columns with
// AVX2 (16 registers), four with AVX-512 (32): wide enough that each broadcast
// of x feeds several FMAs, narrow enough that up to kGroupRows rows' partial sums
// stay in registers, so the panel streams from memory in one pass.  More rows go
// through a panel in groups, block by block of kBlock K-rows: the groups after
// the first find the block in L1, so the weights are read from memory once per
// call for any number of rows.  The panels are shared between the calling thread
// and helper threads of our own, as many as XLA's intra-op pool has beyond it
// (`Helper`: awake between the products of a step).  Written with GCC vector
// extensions for the widest vectors -march=native enables.

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
// Rows per pass: R x kVectors sums + kVectors weights + 1 broadcast registers.
constexpr int kGroupRows = (kRegisters - kVectors - 1) / kVectors;  // 6 either way.
constexpr int64_t kBlock = 64;                  // K-rows per block of a panel (<= 16 KB).
constexpr int64_t kAhead = 128;                 // K-rows a panel walk prefetches ahead.
constexpr int64_t kMinChunkBytes = 1 << 16;     // Less weight than this stays on one thread.
constexpr int64_t kSpinNs = 200000;             // A helper's wait for the next chunk awake.

// Touches a panel kAhead K-rows ahead of `panel_row`: the hardware prefetchers
// alone leave a panel walk short of the memory's bandwidth once a few rows' FMAs
// sit between its loads.
template <typename W>
inline void Prefetch(const W* panel_row) {
  __builtin_prefetch(panel_row + kAhead * kPanel);
}

// y[r, col:col + kPanel] (+)= x[r, k0:k1] @ panel[k0:k1] for R rows; x is [R, K]
// with row stride K, y [R, N]; the first block (k0 == 0) starts from 0.
template <int R, typename W>
inline void Block(const float* x, const W* panel, float* y, int64_t k, int64_t n,
                  int64_t col, int64_t k0, int64_t k1) {
  vec acc[R][kVectors];
  for (int r = 0; r < R; ++r) {
    const vecu* sums = reinterpret_cast<const vecu*>(y + r * n + col);
    for (int j = 0; j < kVectors; ++j) acc[r][j] = k0 == 0 ? vec{} : vec(sums[j]);
  }
  for (int64_t i = k0; i < k1; ++i) {
    const W* w = panel + i * kPanel;
    Prefetch(w);
    vec wv[kVectors];
    for (int j = 0; j < kVectors; ++j) {
      wv[j] = Load(w + j * kWidth);
      if constexpr (R > 1) __asm__("" : "+x"(wv[j]));  // Loaded once for all R rows.
    }
    for (int r = 0; r < R; ++r) {
      const float s = x[r * k + i];
      for (int j = 0; j < kVectors; ++j) acc[r][j] += s * wv[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    vecu* out = reinterpret_cast<vecu*>(y + r * n + col);
    for (int j = 0; j < kVectors; ++j) out[j] = acc[r][j];
  }
}

// R (1 or 2) rows through two adjacent panels at once: twice the independent sums
// of one panel, to cover the FMA latency (one row: while the weights stream; two rows:
// where the float16 widening and the FMAs, not the bytes, bound the call).
template <int R, typename W>
void PairBlock(const float* x, const W* panels, float* y, int64_t k, int64_t n, int64_t col) {
  static_assert(R == 1 || R == 2, "two panels hold the sums of at most two rows");
  vec acc[R][2][kVectors] = {};
  const W* second = panels + k * kPanel;
  for (int64_t i = 0; i < k; ++i) {
    const W* w0 = panels + i * kPanel;
    const W* w1 = second + i * kPanel;
    Prefetch(w0);
    Prefetch(w1);
    vec wv[2][kVectors];
    for (int j = 0; j < kVectors; ++j) {
      wv[0][j] = Load(w0 + j * kWidth);
      wv[1][j] = Load(w1 + j * kWidth);
    }
    for (int r = 0; r < R; ++r) {
      const float s = x[r * k + i];
      for (int j = 0; j < kVectors; ++j) {
        acc[r][0][j] += s * wv[0][j];
        acc[r][1][j] += s * wv[1][j];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      vecu* out = reinterpret_cast<vecu*>(y + r * n + col + h * kPanel);
      for (int j = 0; j < kVectors; ++j) out[j] = acc[r][h][j];
    }
  }
}

// One block for `rows` (1..kGroupRows) rows.
template <typename W>
void GroupBlock(int64_t rows, const float* x, const W* panel, float* y, int64_t k,
                int64_t n, int64_t col, int64_t k0, int64_t k1) {
  static_assert(kGroupRows == 6, "the cases below are 1..6 rows");
  switch (rows) {
    case 1: Block<1>(x, panel, y, k, n, col, k0, k1); break;
    case 2: Block<2>(x, panel, y, k, n, col, k0, k1); break;
    case 3: Block<3>(x, panel, y, k, n, col, k0, k1); break;
    case 4: Block<4>(x, panel, y, k, n, col, k0, k1); break;
    case 5: Block<5>(x, panel, y, k, n, col, k0, k1); break;
    default: Block<6>(x, panel, y, k, n, col, k0, k1); break;
  }
}

// Panels [p0, p1) for all m rows: one or two rows two panels at a time, up to
// kGroupRows in one pass over each panel, more in groups of equal size, block by block.
template <typename W>
void Panels(const float* x, const W* w, float* y, int64_t m, int64_t k, int64_t n,
            int64_t p0, int64_t p1) {
  if (m == 1) {  // Pairs of panels, then the odd one out.
    for (; p0 + 1 < p1; p0 += 2) PairBlock<1>(x, w + p0 * k * kPanel, y, k, n, p0 * kPanel);
  } else if (m == 2) {
    for (; p0 + 1 < p1; p0 += 2) PairBlock<2>(x, w + p0 * k * kPanel, y, k, n, p0 * kPanel);
  }
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  const int64_t block = groups == 1 ? k : kBlock;
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
