// A weight product for decoding on XLA:CPU: y[M, N] = x[M, K] @ W[K, N] with W
// stored as [N / 64, K, 64] panels (see panel_dot.py).
//
// One decoding step multiplies a few rows (batch x chunk length) by every weight
// matrix once, so it is bound by reading the weights.  A panel is one contiguous
// walk down K for 64 output columns: each weight vector is loaded once for up to
// kRows rows, whose kRows x 4 partial sums stay in registers, and the panels are
// shared between the threads of XLA's intra-op pool.  Written with GCC vector
// extensions, so -march=native picks the machine's widest vectors.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // Unaligned access.

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

constexpr int64_t kPanel = 64;            // Output columns per panel: 4 vectors of 16.
constexpr int kRows = 6;                  // Rows multiplied per pass over a panel.
constexpr int64_t kMinChunkBytes = 1 << 16;  // Less weight than this stays on one thread.

// y[r, col : col + 64] = x[r, :] @ panel for R rows; x is [R, K] with row stride K.
template <int R>
inline void Panel(const float* x, const float* panel, float* y, int64_t k, int64_t n,
                  int64_t col) {
  v16 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < 4; ++j) acc[r][j] = v16{};
  }
  for (int64_t i = 0; i < k; ++i) {
    const v16u* w = reinterpret_cast<const v16u*>(panel + i * kPanel);
    const v16 w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    for (int r = 0; r < R; ++r) {
      const float s = x[r * k + i];
      acc[r][0] += s * w0;
      acc[r][1] += s * w1;
      acc[r][2] += s * w2;
      acc[r][3] += s * w3;
    }
  }
  for (int r = 0; r < R; ++r) {
    v16u* out = reinterpret_cast<v16u*>(y + r * n + col);
    for (int j = 0; j < 4; ++j) out[j] = acc[r][j];
  }
}

// Panels [p0, p1) for all m rows, kRows at a time.
void Panels(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n,
            int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = w + p * k * kPanel;
    for (int64_t r0 = 0; r0 < m; r0 += kRows) {
      const float* xr = x + r0 * k;
      float* yr = y + r0 * n;
      const int64_t col = p * kPanel;
      switch (std::min<int64_t>(kRows, m - r0)) {
        case 1: Panel<1>(xr, panel, yr, k, n, col); break;
        case 2: Panel<2>(xr, panel, yr, k, n, col); break;
        case 3: Panel<3>(xr, panel, yr, k, n, col); break;
        case 4: Panel<4>(xr, panel, yr, k, n, col); break;
        case 5: Panel<5>(xr, panel, yr, k, n, col); break;
        default: Panel<6>(xr, panel, yr, k, n, col); break;
      }
    }
  }
}

// Chunks of panels, claimed by whichever thread comes first.  The caller claims
// too and then waits only for chunks already being computed, so the product
// finishes even if no pool thread ever starts (the pool may be busy); a pool
// task that starts late finds nothing left and returns.  Shared by pointer so
// such a task never reads a finished call's stack.
struct Job {
  const float* x;
  const float* w;
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

ffi::Error PanelDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y) {
  const auto dims = w.dimensions();
  if (dims.size() != 3 || dims[2] != kPanel) {
    return ffi::Error::InvalidArgument("panel_dot: weights must be [N / 64, K, 64] panels");
  }
  const int64_t panels = dims[0], k = dims[1], n = panels * kPanel;
  if (k == 0 || x.element_count() % k != 0 || y->element_count() != x.element_count() / k * n) {
    return ffi::Error::InvalidArgument("panel_dot: x must be [..., K] and y [..., N]");
  }
  auto job = std::make_shared<Job>();
  job->x = x.typed_data();
  job->w = w.typed_data();
  job->y = y->typed_data();
  job->m = x.element_count() / k;
  job->k = k;
  job->n = n;
  job->panels = panels;
  const int64_t bytes = panels * k * kPanel * static_cast<int64_t>(sizeof(float));
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(pool.num_threads(), bytes / kMinChunkBytes));
  job->chunks = std::min<int64_t>(panels, 4 * threads);
  for (int64_t t = 1; t < threads; ++t) pool.Schedule([job] { job->Work(); });
  job->Work();
  while (job->done.load(std::memory_order_acquire) < job->chunks) Pause();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelDot, PanelDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
