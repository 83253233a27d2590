#include "log.h"

#include <strings.h>

static volatile q4kh_log_level threshold = Q4KH_LOG_INFO;

void q4kh_log_set_threshold(q4kh_log_level level)
{
	threshold = level;
}

q4kh_log_level q4kh_log_threshold(void)
{
	return threshold;
}

const char *q4kh_log_word(q4kh_log_level level)
{
	switch (level) {
	case Q4KH_LOG_DEBUG: return "debug";
	case Q4KH_LOG_INFO: return "info";
	case Q4KH_LOG_WARN: return "warning";
	case Q4KH_LOG_ERROR: return "error";
	}
	return "log";
}

int q4kh_log_parse(const char *word, q4kh_log_level *out)
{
	static const q4kh_log_level all[] = { Q4KH_LOG_DEBUG, Q4KH_LOG_INFO,
	                                      Q4KH_LOG_WARN, Q4KH_LOG_ERROR };

	for (size_t i = 0; word && i < sizeof(all) / sizeof(all[0]); i++)
		if (!strcasecmp(word, q4kh_log_word(all[i]))) {
			*out = all[i];
			return 0;
		}
	return -1;
}
