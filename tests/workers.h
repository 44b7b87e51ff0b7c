/* Work split over forked processes, each exiting 0 on success: the compile
 * tests run their share of a matrix in each (the CI machine has two cores). */
#ifndef FG_TESTS_WORKERS_H
#define FG_TESTS_WORKERS_H

#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"

/* share(w, workers) != 0 is a failure of worker w. At most 16 workers. */
static inline void check_in_workers(int (*share)(int worker, int workers), int workers) {
    pid_t pids[16];
    for (int w = 0; w < workers && w < 16; w++) {
        pids[w] = fork();
        if (pids[w] == 0) _exit(share(w, workers) ? 1 : 0);
    }
    for (int w = 0; w < workers && w < 16; w++) {
        int status = 0;
        waitpid(pids[w], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "compile worker %d failed", w);
    }
}

#endif
