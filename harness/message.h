/* Why a harness call failed. The harness never prints: a call that fails
 * returns 0 and leaves a one-line reason here, per thread, for the caller to
 * print or count. */
#ifndef FG_HARNESS_MESSAGE_H
#define FG_HARNESS_MESSAGE_H

const char *fgh_message(void);

/* Sets the message (its arguments may include fgh_message() itself) and
 * returns 0, so that `return fgh_fail(...)` fails a call. */
int fgh_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
