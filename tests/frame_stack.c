/* Loaded into every test process by LD_PRELOAD (tests/frame_stack.py): before the
 * interpreter starts, points CPython's arena allocator (the memory behind its frame stack's
 * chunks and its small-object arenas) at the C library's malloc and free instead of mmap and
 * munmap. In a program that is not Python the symbol is absent and nothing happens. */
#include <stddef.h>
#include <stdlib.h>

typedef struct {
  void *ctx;
  void *(*alloc)(void *ctx, size_t size);
  void (*free)(void *ctx, void *ptr, size_t size);
} ArenaAllocator; /* PyObjectArenaAllocator, Include/cpython/objimpl.h */

extern void PyObject_SetArenaAllocator(ArenaAllocator *allocator) __attribute__((weak));

static void *heap_alloc(void *ctx, size_t size) {
  (void)ctx;
  return malloc(size);
}

static void heap_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)size;
  free(ptr);
}

static ArenaAllocator heap = {NULL, heap_alloc, heap_free};

__attribute__((constructor)) static void frame_stack_on_the_heap(void) {
  if (PyObject_SetArenaAllocator) PyObject_SetArenaAllocator(&heap);
}
