/* The softhca libraries' own memory (palloc.c): what their threads write (the reader
 * thread's frames, CQ rings, the connection's and the CQ/QP/SRQ objects' state, every
 * msgpack buffer) lives in pages mapped for it alone, never in malloc's heap, so that
 * it never shares a page with memory a program may register: ibv_reg_mr moves the
 * pages it registers onto a memfd (mem.c), and a write into a page while it moves
 * would be lost. Registrations that reach these pages are refused (mem.c asks
 * shca_pages_overlap). */
#ifndef SOFTHCA_PALLOC_H
#define SOFTHCA_PALLOC_H

#include <stddef.h>
#include <stdint.h>

/* Zeroed memory of the allocator's own pages, or NULL (errno ENOMEM). */
void *shca_alloc(size_t n);
/* As realloc(3); the bytes beyond the old size are not zeroed. */
void *shca_realloc(void *p, size_t n);
void shca_free(void *p);
/* Pages outside the allocator that are the library's all the same (a thread's
 * stack): registrations must not reach them either. */
int shca_pages_add(uintptr_t start, uintptr_t end);
void shca_pages_remove(uintptr_t start);
/* 1 when [start, end) reaches any of the library's pages; *lo, *hi the first such
 * region. */
int shca_pages_overlap(uintptr_t start, uintptr_t end, uintptr_t *lo, uintptr_t *hi);

#endif
