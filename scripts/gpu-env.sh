# What the GPU machine's one-kernel tools share (sourced by
# scripts/gpu-profile.sh and scripts/gpu-ncu.sh from the repository root,
# $top, with $model set): the build to run (.gpu/build, unpacked from the
# carried bundle by scripts/gpu-unpack.sh, else _build/gpu) in $build, the
# carried libraries and every plugin folder of the build on the paths, and
# $model a GGUF file (a name of scripts/gen-bench-model.py is generated
# under /tmp/models when missing).
scripts/gpu-unpack.sh
build=.gpu/build
[ -d "$build" ] || build=_build/gpu
export LD_LIBRARY_PATH="$top/.gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
Q4KHOST_PLUGIN_PATH=$(find "$top/$build/plugins" -path '*/.libs/*.so' -printf '%h\n' | sort -u | paste -sd:)
export Q4KHOST_PLUGIN_PATH

case $model in
*.gguf) ;;
*)
	f=/tmp/models/$model.gguf
	[ -f "$f" ] || { mkdir -p /tmp/models && python3 scripts/gen-bench-model.py "$model" "$f.part" >/dev/null && mv "$f.part" "$f"; }
	model=$f
	;;
esac
