dnl FL_CHECK_CUDA: find the CUDA toolkit (it ships no .pc file).
dnl --with-cuda[=PATH|no]; default: look in $CUDA_HOME, /usr/local/cuda, /usr.
dnl Needs cuda_runtime.h, nvrtc.h, libcudart and libnvrtc.  Defines
dnl HAVE_CUDA, CUDA_CFLAGS, CUDA_LIBS and the conditional HAVE_CUDA.
AC_DEFUN([FL_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=PATH|no@:>@],
      [CUDA toolkit for the cuda backend (default: auto-detect)])],
    [], [with_cuda=check])
  fl_have_cuda=no
  CUDA_CFLAGS=
  CUDA_LIBS=
  CUDA_PATH=
  AS_IF([test "x$with_cuda" != xno], [
    AS_CASE(["$with_cuda"],
      [yes|check], [fl_cuda_dirs="${CUDA_HOME:-} /usr/local/cuda /usr"],
      [fl_cuda_dirs="$with_cuda"])
    for fl_d in $fl_cuda_dirs; do
      AS_IF([test -f "$fl_d/include/nvrtc.h" && test -f "$fl_d/include/cuda_runtime.h"], [
        fl_save_CPPFLAGS=$CPPFLAGS; fl_save_LIBS=$LIBS; fl_save_LDFLAGS=$LDFLAGS
        fl_libdir="$fl_d/lib64"
        test -d "$fl_libdir" || fl_libdir="$fl_d/lib"
        CPPFLAGS="$CPPFLAGS -I$fl_d/include"
        LDFLAGS="$LDFLAGS -L$fl_libdir"
        LIBS="-lnvrtc -lcudart $LIBS"
        AC_MSG_CHECKING([for CUDA runtime and NVRTC in $fl_d])
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nvrtc.h>
#include <cuda_runtime.h>]], [[int n = 0; int a, b;
          nvrtcVersion(&a, &b); (void)cudaGetDeviceCount(&n); return n;]])],
          [fl_have_cuda=yes], [fl_have_cuda=no])
        AC_MSG_RESULT([$fl_have_cuda])
        CPPFLAGS=$fl_save_CPPFLAGS; LIBS=$fl_save_LIBS; LDFLAGS=$fl_save_LDFLAGS
        AS_IF([test "x$fl_have_cuda" = xyes], [
          CUDA_PATH=$fl_d
          CUDA_CFLAGS="-I$fl_d/include"
          CUDA_LIBS="-L$fl_libdir -Wl,-rpath,$fl_libdir -lnvrtc -lcudart"
          break
        ])
      ])
    done
    AS_IF([test "x$with_cuda" != xcheck && test "x$fl_have_cuda" = xno],
      [AC_MSG_ERROR([--with-cuda given but no usable CUDA toolkit (nvrtc.h, cuda_runtime.h, libnvrtc, libcudart) was found])])
  ])
  AS_IF([test "x$fl_have_cuda" = xyes],
    [AC_DEFINE([HAVE_CUDA], [1], [Build the CUDA backend (NVRTC + runtime)])])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([CUDA_PATH])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$fl_have_cuda" = xyes])
])
