/* The calling thread's floating-point mode in every thread of an OpenMP team: the MXCSR's
 * flush-to-zero and denormals-are-zero bits (ablate/fpmode.py sets them in torch's threads, not
 * in this library's). A thread takes its mode from the thread that made it, so without this a
 * kernel's worker threads keep whatever mode was current when the team first started, and the
 * bits of a value that meets a subnormal would depend on which thread computed it. */
#ifndef ABLATE_THREAD_MODE_H
#define ABLATE_THREAD_MODE_H
#include <xmmintrin.h>

/* In a team thread: take the caller's `mode` (its _mm_getcsr()); returns the thread's own, to restore. */
static inline unsigned int take_mode(unsigned int mode) {
    unsigned int own = _mm_getcsr();
    _mm_setcsr(mode);
    return own;
}

#endif
