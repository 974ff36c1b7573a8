/* probe.h - wall-clock timing and the memory read-bandwidth probe that --bench reports against.
 *
 * The share of peak that ingot prints is decode GB/s over what this probe measures in the same
 * run, on the same threads: absolute numbers drift between machines, the share does not. */
#ifndef INGOT_PROBE_H
#define INGOT_PROBE_H

#include <stddef.h>

#include "errors.h"

/* Monotonic time in seconds. */
double time_now(void);

/* Best of several passes of n_threads threads summing a buffer of `bytes` (far larger than the
 * last-level cache), in bytes per second of reads. */
err_code probe_cpu_read_bandwidth(size_t bytes, int n_threads, double *bytes_per_s);

#endif
