/* A stand-in for the one thing a machine without an NVIDIA GPU cannot do: answer open() on a device node of the
 * NVIDIA drivers' majors. Used only by the end-to-end tests (tests/e2e), preloaded (LD_PRELOAD) into every process
 * of the test container's SSH sessions.
 *
 * The kernel decides open() of a character node in this order: the mount's nodev flag (EACCES), the file mode
 * (EACCES), the device cgroup (EPERM), and only then the driver behind the major (ENXIO when none is loaded).
 * This shim changes nothing but the last step: when the kernel answered ENXIO for a character node whose major is
 * listed in GPUDOCTOR_SHIM_MAJORS (e.g. "195,234,511": the majors /proc/devices gives nvidia, nvidia-caps and
 * nvidia-uvm), it opens /dev/null with the same access flags instead, as a loaded driver would have answered.
 * Every refusal the kernel makes before that, the device cgroup's EPERM above all, reaches the caller unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>

typedef int (*openat_fn)(int, const char *, int, ...);

static openat_fn real_openat(void) {
    static openat_fn fn;
    if (!fn) fn = (openat_fn)dlsym(RTLD_NEXT, "openat");
    return fn;
}

static int listed(unsigned int major) {
    const char *s = getenv("GPUDOCTOR_SHIM_MAJORS");
    while (s && *s) {
        char *end;
        unsigned long m = strtoul(s, &end, 10);
        if (end == s) return 0;
        if (m == major) return 1;
        s = (*end == ',') ? end + 1 : end;
    }
    return 0;
}

/* fd/errno of the real open; the driver's answer when the kernel found a listed node without a driver. */
static int answer(int fd, int dirfd, const char *path, int flags) {
    struct stat st;
    int saved = errno;
    if (fd >= 0 || saved != ENXIO) return fd;
    if (fstatat(dirfd, path, &st, 0) != 0 || !S_ISCHR(st.st_mode) || !listed(major(st.st_rdev))) {
        errno = saved;
        return fd;
    }
    return real_openat()(AT_FDCWD, "/dev/null", flags & (O_ACCMODE | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return answer(real_openat()(dirfd, path, flags, mode), dirfd, path, flags);
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return answer(real_openat()(AT_FDCWD, path, flags, mode), AT_FDCWD, path, flags);
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

/* The _FORTIFY_SOURCE entry points (no mode argument). */
int __open_2(const char *path, int flags) { return open(path, flags); }
int __open64_2(const char *path, int flags) { return open(path, flags); }
int __openat_2(int dirfd, const char *path, int flags) { return openat(dirfd, path, flags); }
int __openat64_2(int dirfd, const char *path, int flags) { return openat(dirfd, path, flags); }
