/* threads.h: the threading calls of the pool (pool.c), on POSIX threads or on Win32.
 *
 * Windows has no pthreads of its own (MinGW's winpthreads is not there for a build with
 * Visual Studio's tools), so there the pool runs on Win32 threads, slim reader/writer
 * locks and condition variables, which need nothing beyond kernel32. Each call here does
 * what its pthreads namesake does; the pool's atomics are C11's either way.
 */
#ifndef SMOLQ_THREADS_H
#define SMOLQ_THREADS_H

#ifdef _WIN32

#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

typedef HANDLE sq_thread;
typedef SRWLOCK sq_mutex;
typedef CONDITION_VARIABLE sq_cond;

/* A thread's entry point: `static sq_thread_result SQ_THREAD_CALL name(void *arg)`,
 * returning 0. */
typedef DWORD sq_thread_result;
#define SQ_THREAD_CALL WINAPI

static inline void sq_mutex_init(sq_mutex *m) { InitializeSRWLock(m); }
static inline void sq_mutex_lock(sq_mutex *m) { AcquireSRWLockExclusive(m); }
static inline void sq_mutex_unlock(sq_mutex *m) { ReleaseSRWLockExclusive(m); }
static inline void sq_mutex_destroy(sq_mutex *m) { (void)m; } /* an SRW lock holds no resources */

static inline void sq_cond_init(sq_cond *c) { InitializeConditionVariable(c); }
/* INFINITE: returns only once woken (or spuriously, as pthread_cond_wait may). */
static inline void sq_cond_wait(sq_cond *c, sq_mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static inline void sq_cond_broadcast(sq_cond *c) { WakeAllConditionVariable(c); }
static inline void sq_cond_destroy(sq_cond *c) { (void)c; }

/* 0 on success, as pthread_create. The kernel is built against the DLL C runtime, which
 * sets up its per-thread state for threads CreateThread starts. */
static inline int sq_thread_start(sq_thread *t, sq_thread_result (SQ_THREAD_CALL *fn)(void *), void *arg) {
    *t = CreateThread(NULL, 0, fn, arg, 0, NULL);
    return *t ? 0 : -1;
}

static inline void sq_thread_join(sq_thread t) {
    WaitForSingleObject(t, INFINITE);
    CloseHandle(t);
}

/* Gives the core to another ready thread, if one is waiting for it. */
static inline void sq_thread_yield(void) { SwitchToThread(); }

#else

#include <pthread.h>
#include <sched.h>

typedef pthread_t sq_thread;
typedef pthread_mutex_t sq_mutex;
typedef pthread_cond_t sq_cond;

typedef void *sq_thread_result;
#define SQ_THREAD_CALL

static inline void sq_mutex_init(sq_mutex *m) { pthread_mutex_init(m, NULL); }
static inline void sq_mutex_lock(sq_mutex *m) { pthread_mutex_lock(m); }
static inline void sq_mutex_unlock(sq_mutex *m) { pthread_mutex_unlock(m); }
static inline void sq_mutex_destroy(sq_mutex *m) { pthread_mutex_destroy(m); }

static inline void sq_cond_init(sq_cond *c) { pthread_cond_init(c, NULL); }
static inline void sq_cond_wait(sq_cond *c, sq_mutex *m) { pthread_cond_wait(c, m); }
static inline void sq_cond_broadcast(sq_cond *c) { pthread_cond_broadcast(c); }
static inline void sq_cond_destroy(sq_cond *c) { pthread_cond_destroy(c); }

static inline int sq_thread_start(sq_thread *t, sq_thread_result (*fn)(void *), void *arg) {
    return pthread_create(t, NULL, fn, arg);
}

static inline void sq_thread_join(sq_thread t) { pthread_join(t, NULL); }

static inline void sq_thread_yield(void) { sched_yield(); }

#endif

#endif
