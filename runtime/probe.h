/* probe.h - wall-clock timing, and the memory read-bandwidth and FMA-rate probes that --bench reports
 * against.
 *
 * The shares of peak that ingot prints are decode GB/s over what the read probe measures, and on
 * the CPU the prompt's TFLOP/s over what the FMA probe measures, in the same run, on the same
 * threads: absolute numbers drift between machines, the shares do not. */
#ifndef INGOT_PROBE_H
#define INGOT_PROBE_H

#include <stddef.h>

#include "errors.h"

/* Monotonic time in seconds. */
double time_now(void);

/* Best of several passes of n_threads threads summing a buffer of `bytes` (far larger than the
 * last-level cache), in bytes per second of reads. */
err_code probe_cpu_read_bandwidth(size_t bytes, int n_threads, double *bytes_per_s);

/* Best of several passes of n_threads threads each running independent chains of fp32 fused
 * multiply-adds in registers, at the widest vector width the build has (the matrix kernels'), in
 * flops (2 a lane a multiply-add) per second: the prompt's share of the CPU's arithmetic is its
 * TFLOP/s over this. */
double probe_cpu_fma_rate(int n_threads);

#endif
