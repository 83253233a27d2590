#include "plot.h"

#include <math.h>
#include <string.h>

#include "f2.h"

/*
 * Geometry, in SVG user units. The floors' labels live in the right
 * margin, outside the plot, so they cover no data; text that would run
 * past the right edge is wrapped, and every panel is as tall as its text.
 */
#define WIDTH 900.0
#define LEFT 64.0
#define RIGHT 136.0  /* the floors' labels */
#define PLOT_H 120.0
#define LABEL_GAP 12.0 /* the least vertical distance between two floor labels */

/* The widest a character of sans-serif text at SIZE is taken to be, to wrap. */
#define CHAR_W(size) ((size) * 0.62)
/* Characters of text at SIZE on one line from LEFT to the right edge. */
#define FITS(size) ((size_t)((WIDTH - LEFT - 8) / CHAR_W(size)))

#define C_LINE "#1f5fbf"
#define C_BAD "#c62828"
#define C_TIE "#e08600"
#define C_DIM "#888888"

/* N bytes of S (or all, when N is (size_t)-1), escaped for XML. */
static void esc_n(FILE *f, const char *s, size_t n)
{
	for (; s && *s && n; s++, n--) {
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

static void esc(FILE *f, const char *s)
{
	esc_n(f, s, (size_t)-1);
}

/* Bytes of S that fit on a line of at most MAX: up to the last space before
 * the limit, or (a longer word) MAX, not inside a UTF-8 character. */
static size_t line_len(const char *s, size_t max)
{
	size_t cut;

	if (strlen(s) <= max)
		return strlen(s);
	for (cut = max; cut > 0 && s[cut] != ' '; cut--)
		;
	if (cut)
		return cut;
	for (cut = max; cut > 1 && ((unsigned char)s[cut] & 0xc0) == 0x80; cut--)
		;
	return cut;
}

/* The next line of S after one of LEN bytes, spaces skipped. */
static const char *next_line(const char *s, size_t len)
{
	for (s += len; *s == ' '; s++)
		;
	return s;
}

/* How many lines of at most MAX characters S takes; 1 when empty. */
static int count_lines(const char *s, size_t max)
{
	int n = 0;

	for (; s && *s; n++)
		s = next_line(s, line_len(s, max));
	return n ? n : 1;
}

/*
 * S as one <text> at (X, Y) of font SIZE, wrapped to the width and STEP
 * apart (one <tspan> a line); ATTRS are its other attributes. Returns
 * the number of lines.
 */
static int text_lines(FILE *f, double x, double y, double size, double step,
                      const char *attrs, const char *s)
{
	int n = 0;

	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\"%s>", x, y, size, attrs);
	while (s && *s) {
		size_t len = line_len(s, FITS(size));

		fprintf(f, "<tspan x=\"%.1f\" dy=\"%.1f\">", x, n ? step : 0.0);
		esc_n(f, s, len);
		fputs("</tspan>", f);
		s = next_line(s, len);
		n++;
	}
	fputs("</text>\n", f);
	return n ? n : 1;
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
	double top; /* of the plot's frame */
	double lo, dx;
};

static double px(const struct panel *p, int64_t i)
{
	return LEFT + p->dx * (double)i;
}

static double py(const struct panel *p, double cosine)
{
	double c = cosine > 1.0 ? 1.0 : cosine < p->lo ? p->lo : cosine;
	return p->top + (1.0 - c) / (1.0 - p->lo) * PLOT_H;
}

/* A floor as a dashed line across the plot. */
static void hline(FILE *f, const struct panel *p, double value, const char *color,
                  const char *cls)
{
	double y = py(p, value);

	fprintf(f, "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
	           "stroke=\"%s\" stroke-dasharray=\"6 4\"/>\n",
	        cls, LEFT, y, WIDTH - RIGHT, y, color);
}

static void floor_label(FILE *f, double y, const char *color, const char *label,
                        double value)
{
	fprintf(f, "<text class=\"floor-label\" x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
	           "fill=\"%s\">%s %s</text>\n",
	        WIDTH - RIGHT + 6, y + 3, color, label, q4kh_f2_threshold(value).s);
}

/* Both floors, labelled in the right margin: the acceptance floor is never
 * below the catastrophic one, and labels closer than LABEL_GAP are spread
 * apart around their middle. */
static void floors(FILE *f, const struct panel *p, double acceptance)
{
	double ya = py(p, acceptance), yc = py(p, Q4KH_F2_CATASTROPHIC);

	hline(f, p, acceptance, C_TIE, "floor acceptance");
	hline(f, p, Q4KH_F2_CATASTROPHIC, C_BAD, "floor catastrophic");
	if (yc - ya < LABEL_GAP) {
		double mid = (ya + yc) / 2;
		ya = mid - LABEL_GAP / 2;
		yc = mid + LABEL_GAP / 2;
	}
	floor_label(f, ya, C_TIE, "acceptance", acceptance);
	floor_label(f, yc, C_BAD, "catastrophic", Q4KH_F2_CATASTROPHIC);
}

static void axes(FILE *f, const struct panel *p, int64_t n)
{
	int64_t step = 1;
	const double bottom = p->top + PLOT_H;

	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
	           "fill=\"none\" stroke=\"%s\"/>\n",
	        LEFT, p->top, WIDTH - LEFT - RIGHT, PLOT_H, C_DIM);
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
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">"
	           "position</text>\n",
	        (LEFT + WIDTH - RIGHT) / 2, bottom + 26);
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
		        x, p->top, x, p->top + PLOT_H, C_DIM);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\" "
		           "fill=\"%s\">prefill</text>\n",
		        x - 3, p->top - 3, C_DIM);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">"
		           "decode</text>\n",
		        x + 3, p->top - 3, C_DIM);
		return;
	}
}

/* The line, broken wherever the cosine is not finite. */
/* A position between the deep probe's bands, not computed. */
#define NOT_COMPUTED(pt) (!(pt)->computed)

static void series(FILE *f, const struct panel *p, const struct q4kh_plot_series *s)
{
	int pen_down = 0;

	fputs("<path class=\"series\" data-candidate=\"", f);
	esc(f, s->label);
	fputs("\" d=\"", f);
	for (int64_t i = 0; i < s->n_points; i++) {
		if (NOT_COMPUTED(&s->points[i]))
			continue; /* the deep probe's positions between its bands */
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

	if (NOT_COMPUTED(pt))
		return;
	if (!isfinite(pt->cosine)) {
		y = p->top + PLOT_H - 6;
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

/* Lines of the label (13 px, bold) and the summary (11 px) of a panel. */
static double panel_text_height(const struct q4kh_plot_series *s)
{
	return 16.0 * count_lines(s->label, FITS(13)) + 14.0 * count_lines(s->summary, FITS(11));
}

/* From the top of a panel to its frame: text, then room for "prefill" and
 * "decode" above the frame; below the frame its axis and a gap. */
#define ABOVE_FRAME(s) (panel_text_height(s) + 16.0)
#define BELOW_FRAME 40.0

static double panel_height(const struct q4kh_plot_series *s)
{
	return ABOVE_FRAME(s) + PLOT_H + BELOW_FRAME;
}

static void panel(FILE *f, double top, const struct q4kh_plot_series *s)
{
	struct panel p = { top + ABOVE_FRAME(s), scale_low(s), 0 };
	int label_lines;

	p.dx = (WIDTH - LEFT - RIGHT) / (double)(s->n_points > 1 ? s->n_points - 1 : 1);
	fputs("<g class=\"panel\">\n", f);
	label_lines = text_lines(f, LEFT, top + 13, 13, 16, " font-weight=\"bold\"", s->label);
	text_lines(f, LEFT, top + 16.0 * label_lines + 11, 11, 14, "", s->summary);
	axes(f, &p, s->n_points);
	floors(f, &p, s->floor);
	boundary(f, &p, s);
	series(f, &p, s);
	for (int64_t i = 0; i < s->n_points; i++)
		mark(f, &p, i, &s->points[i]);
	if (s->n_points == 0)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
		           "fill=\"%s\">no positions measured</text>\n",
		        (WIDTH + LEFT - RIGHT) / 2, p.top + PLOT_H / 2, C_BAD);
	fputs("</g>\n", f);
}

/* The legend, one row with its baseline at Y. */
static void legend(FILE *f, double y)
{
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
	/* Title, subtitle lines, the legend, a gap. */
	const double head = 38 + 14.0 * count_lines(subtitle, FITS(11)) + 20;
	double height = head + (n ? 0 : 40), top = head;

	for (size_t i = 0; i < n; i++)
		height += panel_height(&s[i]);
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	           "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
	           "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n<title>",
	        WIDTH, height, WIDTH, height);
	esc(f, title);
	fputs("</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", f);
	text_lines(f, LEFT, 22, 15, 18, " font-weight=\"bold\"", title);
	text_lines(f, LEFT, 38, 11, 14, "", subtitle);
	legend(f, head - 14);
	for (size_t i = 0; i < n; i++) {
		panel(f, top, &s[i]);
		top += panel_height(&s[i]);
	}
	if (n == 0)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">no candidates</text>\n",
		        LEFT, head + 20);
	fputs("</svg>\n", f);
	return ferror(f) ? -1 : 0;
}
