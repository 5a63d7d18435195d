#!/usr/bin/env bash
# Checks that a gasloc .deb runs on a host that has only its Depends installed:
#   scripts/check_deb_depends.sh build/package/gasloc_0.1.0_amd64.deb
# - Depends names no -dev package;
# - the packaged program's libraries all resolve (ldd shows nothing missing), and so do those it
#   loads or runs itself: SentencePiece's libsentencepiece_train.so.0 (dlopen()ed,
#   src/gasloc/data/spm_runtime.hpp) and gnuplot (plots, src/gasloc/study/plot.cpp);
# - every one of those files belongs to a package that installing the .deb brings in: one named
#   in Depends, or a dependency of one (Depends and Pre-Depends, transitively; of alternatives
#   "a | b" the first one this machine has, as installed or provided), or an Essential package
#   (present on every Debian host).
# The closure is computed from this machine's dpkg database (no network, no apt lists), where the
# build dependencies are installed: the runtime packages are among them. Exit 0 when all hold.
set -euo pipefail
deb=${1:?usage: scripts/check_deb_depends.sh PACKAGE.deb}
[ -f "$deb" ] || { echo "check_deb_depends: no file '$deb' (build it with scripts/package.sh)" >&2; exit 1; }
fail() { echo "check_deb_depends: FAIL: $*" >&2; exit 1; }

depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
dev=$(tr ',|' '\n\n' <<<"$depends" | sed -E 's/\(.*\)//; s/:[a-z0-9]+//; s/[[:space:]]//g' | grep -E -- '-dev$' || true)
[ -z "$dev" ] || fail "Depends names build-only packages: $(echo $dev) (name their runtime libraries instead)"

# The closure of Depends over this machine's installed packages, plus the Essential ones.
closure=$(dpkg-query -W -f='${Package}\t${db:Status-Abbrev}\t${Essential}\t${Provides}\t${Pre-Depends}, ${Depends}\n' |
  awk -F'\t' -v deps="$depends" '
    function clean(s) { gsub(/\([^)]*\)/, "", s); gsub(/:[a-z0-9]+/, "", s); gsub(/[[:space:]]/, "", s); return s }
    function pick(group,   alts, n, i, a) {  # the installed package that satisfies "a | b | ..."
      n = split(group, alts, "|")
      for (i = 1; i <= n; i++) { a = clean(alts[i]); if (a in inst) return a }
      for (i = 1; i <= n; i++) { a = clean(alts[i]); if (a in prov) return prov[a] }
      return ""
    }
    function add(list,   groups, n, i, p) {
      n = split(list, groups, ",")
      for (i = 1; i <= n; i++) {
        if (clean(groups[i]) == "") continue
        p = pick(groups[i])
        if (p == "") { print "UNSATISFIED\t" clean(groups[i]); continue }
        if (!(p in seen)) { seen[p] = 1; queue[++qn] = p }
      }
    }
    $2 !~ /^ii/ { next }
    { inst[$1] = 1; dep[$1] = $5
      if ($3 == "yes") ess[$1] = 1
      np = split($4, pv, ","); for (i = 1; i <= np; i++) { v = clean(pv[i]); if (v != "" && !(v in prov)) prov[v] = $1 } }
    END {
      add(deps)
      for (q = 1; q <= qn; q++) add(dep[queue[q]])
      for (p in seen) print "IN\t" p
      for (p in ess) print "IN\t" p
    }')
unsat=$(awk -F'\t' '$1 == "UNSATISFIED" { print $2 }' <<<"$closure" | sort -u)
[ -z "$unsat" ] || fail "no installed package satisfies: $(echo $unsat) (install the runtime packages, scripts/setup.sh)"
in_closure() { grep -qxF "IN	$1" <<<"$closure"; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"
bin=$root/usr/bin/gasloc
[ -x "$bin" ] || fail "the package has no usr/bin/gasloc"

# The files the program needs at run time: its libraries, SentencePiece's and theirs, gnuplot.
files=()
resolve_libs() {  # ldd FILE: fail on any library it cannot find, else list the resolved paths
  local out
  out=$(ldd "$1") || fail "ldd $1 failed: $out"
  if grep -q 'not found' <<<"$out"; then fail "$1: libraries not found: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"; fi
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"
}
mapfile -t -O "${#files[@]}" files < <(resolve_libs "$bin")
cache=$(ldconfig -p)
spm=$(awk '$1 == "libsentencepiece_train.so.0" && !found { print $NF; found = 1 }' <<<"$cache")
[ -n "$spm" ] || fail "libsentencepiece_train.so.0 is not installed here (libsentencepiece0)"
files+=("$spm")
mapfile -t -O "${#files[@]}" files < <(resolve_libs "$spm")
# The Python module, when the package has it (Depends: python3-torch): its libraries too.
for mod in "$root"/usr/lib/python3/dist-packages/gasloc/_core*.so; do
  [ -f "$mod" ] || continue
  mapfile -t -O "${#files[@]}" files < <(resolve_libs "$mod")
done
gp=$(command -v gnuplot) || fail "gnuplot is not installed here (gnuplot-nox)"
files+=("$gp")

# Which package owns each file, through symlinks (alternatives) and the /usr merge: one dpkg -S
# over every spelling of every file (dpkg -S takes a second or so per call).
declare -A owner_of=() seen=()
uniq=()
for f in "${files[@]}"; do [ -n "${seen[$f]:-}" ] || { seen[$f]=1; uniq+=("$f"); }; done
spellings() { local c r; r=$(readlink -f "$1"); for c in "$1" "$r"; do printf '%s\n' "$c" "${c#/usr}" "/usr$c"; done; }
mapfile -t candidates < <(for f in "${uniq[@]}"; do spellings "$f"; done | sort -u)
while IFS= read -r line; do
  path=${line##*: }
  pkg=${line%%: *}
  pkg=${pkg%%,*}
  owner_of[$path]=${pkg%%:*}
done < <(dpkg -S "${candidates[@]}" 2>/dev/null | grep -v '^diversion' || true)
bad=()
for f in "${uniq[@]}"; do
  p=""
  while IFS= read -r c; do [ -n "${owner_of[$c]:-}" ] && { p=${owner_of[$c]}; break; }; done < <(spellings "$f")
  if [ -z "$p" ]; then bad+=("$f (no package owns it)"); continue; fi
  if in_closure "$p"; then printf '  ok  %-55s %s\n' "$f" "$p"; else bad+=("$f ($p, not brought in by Depends)"); fi
done
((${#bad[@]} == 0)) || fail "files the program needs that installing the package would not provide: ${bad[*]}"
echo "check_deb_depends: OK: ${#uniq[@]} files, all provided by Depends (closure of $(grep -c '^IN' <<<"$closure") packages with the essential ones)"
