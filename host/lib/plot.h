/*
 * F2 measurements drawn as an SVG image (q4khost validate --plot), written
 * by hand: one panel per candidate with its cosine against position across
 * prefill and decode, the acceptance and catastrophic floors as horizontal
 * lines, the prefill/decode boundary as a vertical one, and a mark on every
 * rejected, near-tie, unjudged and non-finite position, so a divergence
 * that starts at some position is seen at a glance. Non-finite cosines
 * (F2.1) are marked at the panel's foot and break the line instead of
 * being drawn. Each candidate's line is one <path class="series"> whose
 * data-candidate attribute holds the candidate's label; every mark has a
 * <title> (the tooltip) and a data-position. Thread-safe for distinct F.
 */
#ifndef Q4KH_PLOT_H
#define Q4KH_PLOT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "receipt.h"

struct q4kh_plot_series {
	const char *label;   /* "cpu/cpu-q8act on device 0" */
	const char *summary; /* one line under the label: verdict, message */
	double floor;        /* the acceptance floor the candidate was judged by */
	const struct q4kh_receipt_point *points; /* position i is points[i] */
	int64_t n_points;    /* 0: drawn as an empty panel saying summary */
};

/*
 * Write the image of the N series S under TITLE and a SUBTITLE line to F.
 * Text is escaped for XML. -1 when writing to F failed, else 0.
 */
int q4kh_plot_svg(FILE *f, const char *title, const char *subtitle,
                  const struct q4kh_plot_series *s, size_t n);

#endif
