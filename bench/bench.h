/* bench/bench.h: what the bench's C programs (driver_kvtier.c, socket_floor.c) share: their
 * clocks and their size arguments. Header-only, included by each from this directory. */
#ifndef KVTIER_BENCH_H
#define KVTIER_BENCH_H

#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

/* Wall-clock seconds (monotonic). */
static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* CPU seconds of the calling thread. */
static inline double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process so far, user and system (getrusage). */
static inline void rusage_s(double *user, double *sys)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    *user = r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6;
    *sys = r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

/* Bytes for "4096", "256K", "2M" or "1G" (either case); 0 for anything else. */
static inline size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    return *end || end == s || v < 1 ? 0 : (size_t)v;
}

#endif
