/*
 * What really ran: the report every run prints to stderr (or returns as
 * JSON). It names the backend plugin file and build, the device, the kernel
 * used for every weight type, and the measured speeds, so a silent fall-back
 * or a stale plugin cannot hide. When F2 decided anything, the report names
 * the probe its verdicts came from ("F2 probe: built-in probe, 64 tokens";
 * in JSON f2.probe: kind, tokens, text). A speed with nothing timed (no time, or
 * one generated token, which prefill gave) is "rate n/a" in the text and
 * null in JSON, never a rate made up from zero. A run's report says how
 * tokens were picked: "sampling: greedy", or the temperature, top-k, top-p
 * and seed (JSON: sampling.mode "greedy" or "sampled", with those four).
 * Every backend refused because its init or device enumeration crashed or
 * hung (enumerate.h) is named with why ("refused backend NAME (FILE):
 * WHY"; JSON refused_backends: name, file, reason), and so is every file
 * of the plugin path the loader rejected (registry.h: a mode that lets
 * others write it, a descriptor it refused), whose kernels would
 * otherwise be missed without a word ("rejected plugin NAME (FILE): WHY";
 * JSON rejected_plugins: name, file, reason). A run's report says,
 * before its speeds and stop line (the last), its time to the first token
 * and the start-up phases in it ("time to first token 0.412 s: start-up
 * 0.301 s (plugins ..., model ..., choice and F2 ..., session ...),
 * prefill 0.108 s"; JSON time_to_first_token: seconds, startup_seconds,
 * prefill_seconds and the phases).
 */
#ifndef Q4KH_REPORT_H
#define Q4KH_REPORT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "sampler.h"
#include "select.h"
#include "session.h"

/*
 * Where a run's time to its first token went (docs/architecture.md
 * section 7, "Start-up"), in seconds, each phase from the end of the one
 * before, the first from the command's start: what the process does once
 * before its first prompt, then that prompt's prefill (the report's own
 * prefill seconds) and the first token's pick.
 */
struct q4kh_startup {
	double plugins; /* config, the plugin scan, the helpers' vetting, the settings check */
	double model;   /* the model file mapped and parsed, its tokenizer, the prompt's ids */
	double choice;  /* the plan, F2 (a receipt read, or a measurement), the weights
	                   on the backend and through the variant */
	double session; /* the KV cache, and the step graphs of the prompt's chunks
	                   built, planned and prepared with their scratch */
	double first_token; /* the command's start to the first token picked: the
	                       phases, the prefill and the pick */
};

struct q4kh_report {
	const char *model_path;
	const struct q4kh_model *model;
	const struct q4kh_backend *backend;
	const struct q4kh_selection *selection; /* F2 verdict and fall-backs */
	const struct q4kh_registry *registry;   /* its refused backends; may be NULL */
	uint32_t device_index;
	const char *chat_template; /* "gemma", or "none (raw text)" */
	/* How tokens were picked, so a sampled run can be made again; NULL:
	 * not said (serve's status, which generates nothing itself). */
	const struct q4kh_sampler_params *sampling;
	const struct q4kh_session_stats *steps; /* how the steps ran; may be NULL */
	int64_t prompt_tokens; /* prefilled: fewer than prompt_total when stopped */
	int64_t prompt_total;  /* the prompt's tokens */
	double prefill_seconds;
	int64_t generated_tokens;
	double decode_seconds; /* over generated_tokens - 1 decode steps */
	const char *stop_reason; /* "end of generation token", "token limit", ... */
	/* the start-up phases and the time to the first token; NULL: not
	 * timed, or no token was picked */
	const struct q4kh_startup *startup;
};

/* Print the report as "q4khost: ..." lines. */
void q4kh_report_print(FILE *f, const struct q4kh_report *r);
/* The same as a new JSON object (caller owns the reference); NULL on OOM. */
json_t *q4kh_report_json(const struct q4kh_report *r);

#endif
