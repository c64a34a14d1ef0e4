/* alloc_fail — malloc, calloc, realloc and free replaced for one test program by wrappers
 * over glibc's own (__libc_*): they count alloc_live blocks and fail the allocation an armed
 * alloc_countdown reaches, so a test can fail every allocation of an operation in turn (SQLite's
 * way). Include in exactly one file of the program. AddressSanitizer replaces malloc
 * itself: ALLOC_FAIL_WORKS is 0 under it (the test then says it is skipped). One thread:
 * the alloc_countdown is not atomic. */
#ifndef PAGEDSERVE_TEST_ALLOC_FAIL_H
#define PAGEDSERVE_TEST_ALLOC_FAIL_H

#include <stddef.h>
#include <stdio.h>

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_FAIL_WORKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ALLOC_FAIL_WORKS 0
#endif
#endif
#ifndef ALLOC_FAIL_WORKS
#define ALLOC_FAIL_WORKS 1
#endif

static long alloc_countdown = -1; /* allocations left before one fails; < 0: none fails */
static long alloc_live;           /* blocks allocated and not freed */

#if ALLOC_FAIL_WORKS
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

/* Whether this allocation is the one to fail. */
static int fail_now(void)
{
    if (alloc_countdown < 0)
        return 0;
    return alloc_countdown-- == 0;
}

void *malloc(size_t n)
{
    void *p = fail_now() ? NULL : __libc_malloc(n);
    alloc_live += p != NULL;
    return p;
}

void *calloc(size_t n, size_t size)
{
    void *p = fail_now() ? NULL : __libc_calloc(n, size);
    alloc_live += p != NULL;
    return p;
}

void *realloc(void *old, size_t n)
{
    if (!old)
        return malloc(n);
    return fail_now() ? NULL : __libc_realloc(old, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = fail_now() ? NULL : __libc_memalign(align, n);
    alloc_live += p != NULL;
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

void free(void *p)
{
    alloc_live -= p != NULL;
    __libc_free(p);
}

#endif

/* Whether this build cannot fail allocations (then a test says it is skipped, and why). */
static inline int alloc_fail_skipped(void)
{
    if (ALLOC_FAIL_WORKS)
        return 0;
    printf("skipped: AddressSanitizer owns malloc in this build\n");
    return 1;
}

#endif
