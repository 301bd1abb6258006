/*
** emu_hook.c -- linked into every kernel library the emulator builds:
** UBSan's alignment check (kernels are compiled with
** -fsanitize=alignment) reports through the emulator, which fails the
** launch naming the kernel and thread, instead of through libubsan.
** Hidden, so each library binds to its own copy whatever else the
** process has loaded.
*/
#include <stdint.h>

void emu_fault(const char *fmt, ...);

struct src_loc { const char *file; unsigned line, col; };
struct type_desc { unsigned short kind, info; char name[1]; };
struct mismatch {
  struct src_loc loc;
  const struct type_desc *type;
  unsigned char log_align;
  unsigned char check_kind;
};

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN void __ubsan_handle_type_mismatch_v1(struct mismatch *d, uintptr_t p);
HIDDEN void __ubsan_handle_type_mismatch_v1_abort(struct mismatch *d, uintptr_t p);

void __ubsan_handle_type_mismatch_v1(struct mismatch *d, uintptr_t p) {
  if (!p)
    emu_fault("%s:%u:%u: null pointer used as %s", d->loc.file, d->loc.line, d->loc.col, d->type->name);
  else
    emu_fault("%s:%u:%u: misaligned access: %s at %p needs %u-byte alignment", d->loc.file,
              d->loc.line, d->loc.col, d->type->name, (void *)p, 1u << d->log_align);
}

void __ubsan_handle_type_mismatch_v1_abort(struct mismatch *d, uintptr_t p) {
  __ubsan_handle_type_mismatch_v1(d, p);
}
