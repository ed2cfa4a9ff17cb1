/* Lets CRIU dump a process of another user on a host where root lacks CAP_SYS_RESOURCE.
 *
 * CRIU reads each dumped task's resource limits with syscall(SYS_prlimit64, pid, resource,
 * NULL, &old). Across users the kernel allows that read only with CAP_SYS_RESOURCE, which some
 * virtual machines withhold even from root, and the dump of every sandboxed kernel (uid 1000)
 * then fails: "Can't get rlimit 0: Operation not permitted". The same limits are in
 * /proc/PID/limits, which anyone may read. ./run.sh preloads this library into CRIU (through
 * the loader of CRIU's own root) only on such hosts; it answers a refused read-only
 * prlimit64 from that file and leaves every other call, and every write of a limit, alone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>

/* The kernel's names in /proc/PID/limits, indexed by resource number (RLIMIT_CPU = 0 ...). */
static const char *const limit_names[] = {
    "Max cpu time", "Max file size", "Max data size", "Max stack size",
    "Max core file size", "Max resident set", "Max processes", "Max open files",
    "Max locked memory", "Max address space", "Max file locks", "Max pending signals",
    "Max msgqueue size", "Max nice priority", "Max realtime priority", "Max realtime timeout",
};

static int parse_limit(const char *text, rlim64_t *value) {
    char *end;
    if (strcmp(text, "unlimited") == 0) {
        *value = RLIM64_INFINITY;
        return 0;
    }
    errno = 0;
    *value = strtoull(text, &end, 10);
    return errno != 0 || end == text || *end != '\0' ? -1 : 0;
}

/* 0 with *limit filled from /proc/PID/limits, -1 when the file or the line is not there. */
static int read_proc_limit(pid_t pid, long resource, struct rlimit64 *limit) {
    char path[64], line[256], soft[32], hard[32];
    size_t count = sizeof(limit_names) / sizeof(limit_names[0]);
    int found = -1;
    if (resource < 0 || (size_t)resource >= count) return -1;
    const char *name = limit_names[resource];
    size_t length = strlen(name);
    snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
    FILE *file = fopen(path, "re");
    if (file == NULL) return -1;
    while (fgets(line, sizeof(line), file) != NULL) {
        /* The whole name, up to the padding before the soft limit's column. */
        if (strncmp(line, name, length) != 0 || line[length] != ' ') continue;
        if (sscanf(line + length, "%31s %31s", soft, hard) == 2 &&
            parse_limit(soft, &limit->rlim_cur) == 0 && parse_limit(hard, &limit->rlim_max) == 0)
            found = 0;
        break;
    }
    fclose(file);
    return found;
}

long syscall(long number, ...) {
    static long (*real_syscall)(long, ...);
    long arg[6];
    va_list ap;
    if (real_syscall == NULL) real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    /* Six arguments whatever the call, as glibc's own syscall() passes them on: the extra
     * ones are whatever the registers held, and the kernel ignores them. */
    va_start(ap, number);
    for (int i = 0; i < 6; i++) arg[i] = va_arg(ap, long);
    va_end(ap);
    int saved_errno = errno;
    long result = real_syscall(number, arg[0], arg[1], arg[2], arg[3], arg[4], arg[5]);
    if (number == SYS_prlimit64 && result == -1 && errno == EPERM && (pid_t)arg[0] > 0 &&
        arg[2] == 0 && arg[3] != 0 &&
        read_proc_limit((pid_t)arg[0], arg[1], (struct rlimit64 *)arg[3]) == 0) {
        errno = saved_errno;
        return 0;
    }
    return result;
}
