#include "plot.h"

#include <math.h>

#include "f2.h"

/* Geometry, in SVG user units. */
#define WIDTH 820.0
#define LEFT 64.0
#define RIGHT 24.0
#define HEAD 72.0    /* title, subtitle and legend */
#define PANEL 200.0  /* one candidate: label, summary, plot, axis */
#define PLOT_TOP 44.0
#define PLOT_H 120.0

#define C_LINE "#1f5fbf"
#define C_BAD "#c62828"
#define C_TIE "#e08600"
#define C_DIM "#888888"

static void esc(FILE *f, const char *s)
{
	for (; s && *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&apos;", f); break;
		default:
			/* XML 1.0 allows no control characters but tab and newline. */
			if ((unsigned char)*s >= 0x20 || *s == '\t' || *s == '\n')
				fputc(*s, f);
		}
	}
}

/* The panel's y scale: [lo, 1], lo a multiple of 0.05 below every cosine
 * and both floors. */
static double scale_low(const struct q4kh_plot_series *s)
{
	double lo = Q4KH_F2_CATASTROPHIC - 0.05;

	for (int64_t i = 0; i < s->n_points; i++)
		if (isfinite(s->points[i].cosine) && s->points[i].cosine < lo)
			lo = s->points[i].cosine;
	lo = floor(lo * 20.0 - 0.5) / 20.0;
	return lo < -1.0 ? -1.0 : lo;
}

struct panel {
	double top, lo, dx;
};

static double px(const struct panel *p, int64_t i)
{
	return LEFT + p->dx * (double)i;
}

static double py(const struct panel *p, double cosine)
{
	double c = cosine > 1.0 ? 1.0 : cosine < p->lo ? p->lo : cosine;
	return p->top + PLOT_TOP + (1.0 - c) / (1.0 - p->lo) * PLOT_H;
}

/* A floor; its label above the line (BELOW: under it, so two floors close
 * together keep their labels apart). */
static void hline(FILE *f, const struct panel *p, double value, const char *color,
                  const char *cls, const char *label, int below)
{
	double y = py(p, value);

	fprintf(f, "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
	           "stroke=\"%s\" stroke-dasharray=\"6 4\"/>\n",
	        cls, LEFT, y, WIDTH - RIGHT, y, color);
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\" "
	           "fill=\"%s\">%s %.2f</text>\n",
	        WIDTH - RIGHT - 4, below ? y + 11 : y - 3, color, label, value);
}

static void axes(FILE *f, const struct panel *p, int64_t n)
{
	int64_t step = 1;
	const double bottom = p->top + PLOT_TOP + PLOT_H;

	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
	           "fill=\"none\" stroke=\"%s\"/>\n",
	        LEFT, p->top + PLOT_TOP, WIDTH - LEFT - RIGHT, PLOT_H, C_DIM);
	for (double v = 1.0; v >= p->lo - 1e-9; v -= (1.0 - p->lo) / 4)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">"
		           "%.3f</text>\n",
		        LEFT - 4, py(p, v) + 3, v);
	while (n / step > 12)
		step *= 2;
	for (int64_t i = 0; i < n; i += step)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">"
		           "%lld</text>\n",
		        px(p, i), bottom + 12, (long long)i);
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">"
	           "position</text>\n",
	        WIDTH - RIGHT, bottom + 24);
}

/* The prefill/decode boundary, between the last prefill position and the
 * first decode step. */
static void boundary(FILE *f, const struct panel *p, const struct q4kh_plot_series *s)
{
	for (int64_t i = 1; i < s->n_points; i++) {
		double x;
		if (s->points[i].decode_step < 0 || s->points[i - 1].decode_step >= 0)
			continue;
		x = (px(p, i - 1) + px(p, i)) / 2;
		fprintf(f, "<line class=\"boundary\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
		           "y2=\"%.1f\" stroke=\"%s\"/>\n",
		        x, p->top + PLOT_TOP, x, p->top + PLOT_TOP + PLOT_H, C_DIM);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\" "
		           "fill=\"%s\">prefill</text>\n",
		        x - 3, p->top + PLOT_TOP - 3, C_DIM);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">"
		           "decode</text>\n",
		        x + 3, p->top + PLOT_TOP - 3, C_DIM);
		return;
	}
}

/* The line, broken wherever the cosine is not finite. */
static void series(FILE *f, const struct panel *p, const struct q4kh_plot_series *s)
{
	int pen_down = 0;

	fputs("<path class=\"series\" data-candidate=\"", f);
	esc(f, s->label);
	fputs("\" d=\"", f);
	for (int64_t i = 0; i < s->n_points; i++) {
		if (!isfinite(s->points[i].cosine)) {
			pen_down = 0;
			continue;
		}
		fprintf(f, "%s%.1f %.1f ", pen_down ? "L" : "M", px(p, i),
		        py(p, s->points[i].cosine));
		pen_down = 1;
	}
	fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", C_LINE);
}

static void where(FILE *f, int64_t i, const struct q4kh_receipt_point *pt)
{
	if (pt->decode_step >= 0)
		fprintf(f, "position %lld (decode step %d)", (long long)i, pt->decode_step);
	else
		fprintf(f, "position %lld (prefill)", (long long)i);
}

static void mark(FILE *f, const struct panel *p, int64_t i,
                 const struct q4kh_receipt_point *pt)
{
	double x = px(p, i), y;
	const char *what, *tag = "circle";

	if (!isfinite(pt->cosine)) {
		y = p->top + PLOT_TOP + PLOT_H - 6;
		fprintf(f, "<path class=\"mark nonfinite\" data-position=\"%lld\" "
		           "d=\"M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f\" stroke=\"%s\" "
		           "stroke-width=\"2\"><title>",
		        (long long)i, x - 4, y - 4, x + 4, y + 4, x - 4, y + 4, x + 4, y - 4,
		        C_BAD);
		where(f, i, pt);
		fputs(": cosine not computable: NaN/Inf or a zero vector (F2.1)</title></path>\n", f);
		return;
	}
	y = py(p, pt->cosine);
	if (!pt->judged) {
		what = "not judged";
		fprintf(f, "<circle class=\"mark unjudged\" data-position=\"%lld\" cx=\"%.1f\" "
		           "cy=\"%.1f\" r=\"3.5\" fill=\"white\" stroke=\"%s\">",
		        (long long)i, x, y, C_DIM);
	} else if (pt->verdict != Q4KH_F2_PASS) {
		what = q4kh_f2_verdict_name(pt->verdict);
		fprintf(f, "<circle class=\"mark rejected\" data-position=\"%lld\" cx=\"%.1f\" "
		           "cy=\"%.1f\" r=\"3.5\" fill=\"%s\">",
		        (long long)i, x, y, C_BAD);
	} else if (pt->near_tie) {
		what = "a tolerated near-tie";
		tag = "path";
		fprintf(f, "<path class=\"mark near-tie\" data-position=\"%lld\" "
		           "d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\">",
		        (long long)i, x, y - 5, x + 5, y, x, y + 5, x - 5, y, C_TIE);
	} else {
		return;
	}
	fputs("<title>", f);
	where(f, i, pt);
	fprintf(f, ": cosine %.4f, %s</title></%s>\n", pt->cosine, what, tag);
}

static void panel(FILE *f, double top, const struct q4kh_plot_series *s)
{
	struct panel p = { top, scale_low(s), 0 };

	p.dx = (WIDTH - LEFT - RIGHT) / (double)(s->n_points > 1 ? s->n_points - 1 : 1);
	fputs("<g class=\"panel\">\n", f);
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">", LEFT,
	        top + 16);
	esc(f, s->label);
	fprintf(f, "</text>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", LEFT, top + 31);
	esc(f, s->summary);
	fputs("</text>\n", f);
	axes(f, &p, s->n_points);
	hline(f, &p, s->floor, C_TIE, "floor acceptance", "acceptance floor", 0);
	hline(f, &p, Q4KH_F2_CATASTROPHIC, C_BAD, "floor catastrophic", "catastrophic floor", 1);
	boundary(f, &p, s);
	series(f, &p, s);
	for (int64_t i = 0; i < s->n_points; i++)
		mark(f, &p, i, &s->points[i]);
	if (s->n_points == 0)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
		           "fill=\"%s\">no positions measured</text>\n",
		        (WIDTH + LEFT - RIGHT) / 2, top + PLOT_TOP + PLOT_H / 2, C_BAD);
	fputs("</g>\n", f);
}

static void legend(FILE *f)
{
	const double y = 58;

	fprintf(f, "<g class=\"legend\" font-size=\"11\">\n"
	           "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"/>"
	           "<text x=\"%.1f\" y=\"%.1f\">cosine (reference vs candidate logits)</text>\n"
	           "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>"
	           "<text x=\"%.1f\" y=\"%.1f\">rejected</text>\n"
	           "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>"
	           "<text x=\"%.1f\" y=\"%.1f\">near-tie</text>\n"
	           "<path d=\"M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
	           "<text x=\"%.1f\" y=\"%.1f\">NaN/Inf</text>\n"
	           "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"white\" stroke=\"%s\"/>"
	           "<text x=\"%.1f\" y=\"%.1f\">not judged</text>\n</g>\n",
	        LEFT, y - 4, LEFT + 20, y - 4, C_LINE, LEFT + 24, y,
	        LEFT + 290, y - 4, C_BAD, LEFT + 298, y,
	        LEFT + 370, y - 9, LEFT + 375, y - 4, LEFT + 370, y + 1, LEFT + 365, y - 4, C_TIE,
	        LEFT + 380, y,
	        LEFT + 446, y - 8, LEFT + 454, y, LEFT + 446, y, LEFT + 454, y - 8, C_BAD,
	        LEFT + 460, y,
	        LEFT + 526, y - 4, C_DIM, LEFT + 534, y);
}

int q4kh_plot_svg(FILE *f, const char *title, const char *subtitle,
                  const struct q4kh_plot_series *s, size_t n)
{
	double height = HEAD + PANEL * (double)(n ? n : 1);

	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	           "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
	           "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n<title>",
	        WIDTH, height, WIDTH, height);
	esc(f, title);
	fprintf(f, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
	           "<text x=\"%.1f\" y=\"22\" font-size=\"15\" font-weight=\"bold\">",
	        LEFT);
	esc(f, title);
	fprintf(f, "</text>\n<text x=\"%.1f\" y=\"38\" font-size=\"11\">", LEFT);
	esc(f, subtitle);
	fputs("</text>\n", f);
	legend(f);
	for (size_t i = 0; i < n; i++)
		panel(f, HEAD + PANEL * (double)i, &s[i]);
	if (n == 0)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">no candidates</text>\n",
		        LEFT, HEAD + 30);
	fputs("</svg>\n", f);
	return ferror(f) ? -1 : 0;
}
