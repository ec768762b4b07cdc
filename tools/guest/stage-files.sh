# Sourced by build-guest-image.sh and bundle-image.sh: copies the files an
# image gets on top of its base into the folder ROOT, from the caller's
# arrays `adds` (SRC:/DEST) and `add_bins` (SRC[:DEST], with every shared
# library ldd names). The caller defines die().

# stage_copy ROOT SRC DEST: DEST is an absolute path inside the image.
# Timestamps are kept: Python's compiled modules (__pycache__) are only used
# while their source's modification time matches.
stage_copy() {
	local root=$1 src=$2 dest=$3
	[[ -e $src ]] || die "no such file: $src"
	mkdir -p "$root$(dirname "$dest")"
	cp -RL --preserve=timestamps "$src" "$root$dest"
}

# stage_files ROOT
stage_files() {
	local root=$1 a src dest dep
	for a in "${adds[@]}"; do
		stage_copy "$root" "${a%%:/*}" "/${a#*:/}"
	done
	for a in "${add_bins[@]}"; do
		src=${a%%:*}
		dest=$src
		[[ $a == *:* ]] && dest=${a#*:}
		[[ $dest == /* ]] || dest=$(realpath -m "$dest")
		stage_copy "$root" "$src" "$dest"
		if ldd "$src" 2>/dev/null | grep -q 'not found'; then
			ldd "$src" >&2
			die "$src needs libraries that are not installed"
		fi
		# Lines look like "libx.so.1 => /lib/.../libx.so.1 (0x...)" or
		# "/lib64/ld-linux-x86-64.so.2 (0x...)"; a static file has none.
		while read -r dep; do
			[[ -e $root$dep ]] || stage_copy "$root" "$dep" "$dep"
		done < <(ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
	done
}
