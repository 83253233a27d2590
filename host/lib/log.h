/*
 * The host's log threshold: plugin log lines (and host notes) below it are
 * dropped. Set once at start-up from Q4KHOST_LOG; reading it is thread-safe.
 */
#ifndef Q4KH_LOG_H
#define Q4KH_LOG_H

#include "q4khost/plugin.h"

/* Default Q4KH_LOG_INFO. */
void q4kh_log_set_threshold(q4kh_log_level level);
q4kh_log_level q4kh_log_threshold(void);
/* "debug", "info", "warning", "error" in any case; -1 for anything else. */
int q4kh_log_parse(const char *word, q4kh_log_level *out);
/* The word for LEVEL, as printed ("warning"). */
const char *q4kh_log_word(q4kh_log_level level);

#endif
