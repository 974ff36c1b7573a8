/* probe_cuda.h - the GPU side of probe.h: whether a CUDA device is there, and its read bandwidth
 * measured by this program (the peak that --bench reports GPU decode against). */
#ifndef INGOT_PROBE_CUDA_H
#define INGOT_PROBE_CUDA_H

#include <stddef.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices (0 when there is no driver or no device); never fails. */
int cuda_device_count(void);

/* Best of several timed passes of a read-only kernel over `bytes` of device memory (16-byte loads,
 * several in flight per thread, one wave of blocks), in bytes per second; *name gets the device's. */
err_code probe_cuda_read_bandwidth(size_t bytes, double *bytes_per_s, char *name, size_t name_cap);

#ifdef __cplusplus
}
#endif

#endif
