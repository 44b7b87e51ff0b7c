/* The harness's failure message: see message.h. */
#include "harness/message.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char message[1024];

const char *fgh_message(void) { return message; }

int fgh_fail(const char *fmt, ...) {
    char text[sizeof message]; /* formatted apart: an argument may be the message */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(message, text, sizeof message);
    return 0;
}
