/* The little of a C library that the kernel's entry points need under emulation
 * (tests/helpers/aarch64_kernel.py), in place of a whole libc: building musl for the target
 * costs a minute or more of every fresh test run.
 *
 * memcpy, memset and getenv are real. What only the forward pass and the thread pool call
 * (the allocator, libm's float functions, pthreads) stops the emulation with a trap, which
 * the emulator reports as an error: those paths are not run here. Compiled with
 * -ffreestanding, so that the compiler does not turn memcpy's loop into a call to memcpy. */

#include <stddef.h>

char **environ; /* the emulator writes the environment's address here (Aarch64Kernel.reset) */

void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    unsigned char *d = dst;
    while (n--)
        *d++ = (unsigned char)c;
    return dst;
}

char *getenv(const char *name) {
    for (char **e = environ; e && *e; e++) {
        const char *a = name, *b = *e;
        while (*a && *a == *b)
            a++, b++;
        if (!*a && *b == '=')
            return (char *)b + 1;
    }
    return NULL;
}

/* Never reached: the tests call functions, not the program. */
void _start(void) { __builtin_trap(); }

#define UNREACHABLE(name) \
    void name(void);      \
    void name(void) { __builtin_trap(); }

UNREACHABLE(malloc)
UNREACHABLE(calloc)
UNREACHABLE(realloc)
UNREACHABLE(free)
UNREACHABLE(cosf)
UNREACHABLE(sinf)
UNREACHABLE(logf)
UNREACHABLE(powf)
UNREACHABLE(sched_yield)
UNREACHABLE(pthread_create)
UNREACHABLE(pthread_join)
UNREACHABLE(pthread_mutex_init)
UNREACHABLE(pthread_mutex_destroy)
UNREACHABLE(pthread_mutex_lock)
UNREACHABLE(pthread_mutex_unlock)
UNREACHABLE(pthread_cond_init)
UNREACHABLE(pthread_cond_destroy)
UNREACHABLE(pthread_cond_wait)
UNREACHABLE(pthread_cond_broadcast)
