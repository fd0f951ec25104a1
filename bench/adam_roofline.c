// adam_roofline: the reference (the "probe") for `zps-bench optimizer` on this machine: a plain
// Adam step over fp32 arrays, bound by memory traffic, measured in the same run as zps's fused
// pass (scripts/bench-optimizer.sh builds and runs both, interleaved).
//
// It is deliberately plain: one compiler-vectorised loop, no intrinsics, no prefetching, no
// streaming stores, parallelised with OpenMP. It shows what a straightforward implementation
// gets out of the memory system; a tuned kernel that moves fewer bytes can exceed it.
//
//   cc -O3 -march=native -fno-math-errno -fopenmp bench/adam_roofline.c -o adam_roofline -lm
//   OMP_NUM_THREADS=1 ./adam_roofline [params [timed_steps]]
//
// params defaults to 64Mi (67108864: 1 GiB of fp32 parameters, gradient, m and v plus 128 MiB of
// fp16 copy, far beyond any cache); timed_steps defaults to 6, after 2 untimed warm-up steps.
// Each figure is the best timed step (the least disturbed by other processes). The passes, and
// the bytes each must move:
//
//   adam_fp32       Adam over fp32 arrays: read grad, param, m, v; write param, m, v   28 B/param
//   cast_fp16       a 16-bit copy of the parameters: read param, write the copy          6 B/param
//   adam_then_cast  both, one after the other in the same step (an update pass, then a
//                   second pass that casts the serving copy)                           34 B/param
//
// Output: one JSON line, e.g.
//   {"threads": 1, "params": 67108864, "adam_fp32_mparams_per_s": 850, ...}
// scripts/bench-optimizer.sh reads "threads", "adam_fp32_mparams_per_s" and
// "adam_then_cast_mparams_per_s" from it; keep those names.
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kWarmupSteps = 2, kDefaultTimedSteps = 6 };

typedef struct {
  size_t n;
  float* param;
  float* grad;
  float* m;
  float* v;
  _Float16* copy;
} State;

typedef struct {
  float lr, beta1, beta2, eps;
} AdamHyper;

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void* alloc_or_die(size_t bytes) {
  // Cache-line alignment and ordinary pages, as `zps-bench optimizer` without --huge-pages;
  // aligned_alloc wants the size rounded up to a multiple of the alignment.
  const size_t align = 64;
  void* p = aligned_alloc(align, (bytes + align - 1) / align * align);
  if (p == NULL) {
    fprintf(stderr, "adam_roofline: cannot allocate %zu bytes\n", bytes);
    exit(1);
  }
  return p;
}

// First touch from the same threads, with the same static schedule, as the timed loops, so
// each thread's pages are local to it and no page fault lands inside a timed step.
static void first_touch(State* s) {
  const size_t n = s->n;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    s->param[i] = 0.5f - 0.001f * (float)(i % 1000);
    s->grad[i] = 0.002f * (float)((i * 7) % 11) - 0.01f;
    s->m[i] = 0.0f;
    s->v[i] = 0.0f;
    s->copy[i] = (_Float16)0.0f;
  }
}

static void adam_step(State* s, const AdamHyper* h, int step) {
  const size_t n = s->n;
  float* restrict param = s->param;
  const float* restrict grad = s->grad;
  float* restrict m = s->m;
  float* restrict v = s->v;
  const float b1 = h->beta1, b2 = h->beta2, eps = h->eps;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  // Bias corrections folded into two scalars: param -= lr / bc1 * m / (sqrt(v / bc2) + eps).
  const float bc1 = 1.0f - powf(b1, (float)step);
  const float bc2 = 1.0f - powf(b2, (float)step);
  const float neg_step_size = -h->lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] += neg_step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

static void cast_step(State* s) {
  const size_t n = s->n;
  const float* restrict param = s->param;
  _Float16* restrict copy = s->copy;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) copy[i] = (_Float16)param[i];
}

static size_t parse_count(const char* arg, const char* what) {
  char* end = NULL;
  unsigned long long value = strtoull(arg, &end, 10);
  if (end == arg || *end != '\0' || value == 0) {
    fprintf(stderr, "adam_roofline: %s must be a positive integer, got '%s'\n", what, arg);
    exit(2);
  }
  return (size_t)value;
}

int main(int argc, char** argv) {
  if (argc > 3 || (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))) {
    fprintf(stderr, "usage: OMP_NUM_THREADS=T %s [params (default 67108864) [timed_steps (6)]]\n",
            argv[0]);
    return argc > 3 ? 2 : 0;
  }
  const size_t n = argc > 1 ? parse_count(argv[1], "params") : (size_t)64 << 20;
  const int timed_steps = argc > 2 ? (int)parse_count(argv[2], "timed_steps") : kDefaultTimedSteps;

  State s;
  s.n = n;
  s.param = alloc_or_die(n * sizeof(float));
  s.grad = alloc_or_die(n * sizeof(float));
  s.m = alloc_or_die(n * sizeof(float));
  s.v = alloc_or_die(n * sizeof(float));
  s.copy = alloc_or_die(n * sizeof(_Float16));
  const AdamHyper hyper = {1e-3f, 0.9f, 0.999f, 1e-8f};
  first_touch(&s);

  double best_adam = INFINITY, best_cast = INFINITY, best_both = INFINITY;
  for (int step = 1; step <= kWarmupSteps + timed_steps; ++step) {
    const double t0 = seconds_now();
    adam_step(&s, &hyper, step);
    const double t1 = seconds_now();
    cast_step(&s);
    const double t2 = seconds_now();
    if (step <= kWarmupSteps) continue;
    if (t1 - t0 < best_adam) best_adam = t1 - t0;
    if (t2 - t1 < best_cast) best_cast = t2 - t1;
    if (t2 - t0 < best_both) best_both = t2 - t0;
  }

  // A sample of the results, printed so that no pass can be optimised away.
  double checksum = 0.0;
  for (size_t i = 0; i < n; i += 4093) checksum += (double)s.param[i] + (double)s.copy[i];

  const double nd = (double)n;
  printf(
      "{\"threads\": %d, \"params\": %zu, \"adam_fp32_mparams_per_s\": %.0f, "
      "\"cast_fp16_mparams_per_s\": %.0f, \"adam_then_cast_mparams_per_s\": %.0f, "
      "\"adam_fp32_gb_per_s\": %.1f, \"checksum\": %.6g}\n",
      omp_get_max_threads(), n, nd / best_adam / 1e6, nd / best_cast / 1e6, nd / best_both / 1e6,
      28.0 * nd / best_adam / 1e9, checksum);

  free(s.param);
  free(s.grad);
  free(s.m);
  free(s.v);
  free(s.copy);
  return 0;
}
