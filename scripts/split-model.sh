#!/usr/bin/env bash
# Split a model file into parts for machines that take only limited
# transfers, and join the parts back, verified by SHA-256.
#
#   split-model.sh split FILE DIR [PART-MiB]   parts of PART-MiB (default 60)
#                                              as DIR/NAME.part.000, .001, ...
#                                              and DIR/SHA256SUMS
#   split-model.sh join DIR OUT                check every part, concatenate
#                                              them in order into OUT, check
#                                              OUT against the whole file's
#                                              SHA-256
#
# SHA256SUMS is sha256sum's format: one line per part, then one for the
# whole file under its own name. join exits non-zero, naming the part or the
# file, when anything is missing or differs, and leaves no OUT behind.
set -euo pipefail

die() {
	echo "split-model.sh: $*" >&2
	exit 1
}

usage() { # STATUS: 0 for --help (on stdout), 2 for a wrong argument
	sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&"$((${1:-2} ? 2 : 1))"
	exit "${1:-2}"
}

split_file() {
	local file=$1 dir=$2 mib=${3:-60} name
	[ -f "$file" ] || die "no file $file"
	[[ $mib =~ ^[1-9][0-9]*$ ]] || die "part size \"$mib\": expected a whole number of MiB"
	name=$(basename "$file")
	mkdir -p "$dir"
	rm -f "$dir/$name".part.* "$dir/SHA256SUMS"
	split -b "${mib}M" -d -a 3 "$file" "$dir/$name.part."
	(
		cd "$dir"
		sha256sum "$name".part.*
	) >"$dir/SHA256SUMS.tmp"
	sha256sum "$file" | sed "s|  .*|  $name|" >>"$dir/SHA256SUMS.tmp"
	mv "$dir/SHA256SUMS.tmp" "$dir/SHA256SUMS"
	echo "$(grep -c '\.part\.' "$dir/SHA256SUMS") parts of at most $mib MiB in $dir, SHA-256 in $dir/SHA256SUMS"
}

join_parts() {
	local dir=$1 out=$2 sums name want got n part
	sums="$dir/SHA256SUMS"
	[ -f "$sums" ] || die "no $sums (written by split-model.sh split)"
	name=$(grep -v '\.part\.[0-9]*$' "$sums" | tail -n 1 | sed 's/^[0-9a-f]*  //')
	want=$(grep -v '\.part\.[0-9]*$' "$sums" | tail -n 1 | cut -d' ' -f1)
	[[ $want =~ ^[0-9a-f]{64}$ ]] || die "$sums has no line for the whole file"
	n=$(grep -c '\.part\.[0-9]*$' "$sums") || die "$sums lists no parts"
	while read -r got part; do
		[ -f "$dir/$part" ] || die "part $part missing from $dir ($n parts expected)"
		[ "$(sha256sum <"$dir/$part" | cut -d' ' -f1)" = "$got" ] ||
			die "part $dir/$part: SHA-256 differs from $sums (damaged in transfer?)"
	done < <(grep '\.part\.[0-9]*$' "$sums" | sed 's/  / /')
	# The listed order is the split order: .000, .001, ...
	grep '\.part\.[0-9]*$' "$sums" | sed 's/^[0-9a-f]*  //' |
		(cd "$dir" && xargs cat) >"$out.tmp"
	got=$(sha256sum <"$out.tmp" | cut -d' ' -f1)
	if [ "$got" != "$want" ]; then
		rm -f "$out.tmp"
		die "joined $name: SHA-256 $got, expected $want"
	fi
	mv "$out.tmp" "$out"
	echo "joined $n parts into $out ($name, SHA-256 $want: OK)"
}

[ $# -ge 1 ] || usage
case $1 in
split) [ $# -eq 3 ] || [ $# -eq 4 ] || usage; split_file "$2" "$3" "${4:-60}" ;;
join) [ $# -eq 3 ] || usage; join_parts "$2" "$3" ;;
-h | --help) usage 0 ;;
*) usage ;;
esac
