/*
 * now — the clocks. Monotonic time measures durations and deadlines inside
 * one process (searches, compiles, retry pauses); wall time is what is
 * stored in the cache or compared between processes (timestamps, leases).
 */
#ifndef STOF_NOW_H
#define STOF_NOW_H

/* Monotonic seconds and milliseconds, from an arbitrary origin. */
double now_mono_s(void);
double now_mono_ms(void);

/* Wall-clock seconds (time(NULL)) and milliseconds since the epoch. */
long long now_wall_s(void);
long long now_wall_ms(void);

#endif
