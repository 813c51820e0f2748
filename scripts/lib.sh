# shellcheck shell=sh
# Shared by the scripts (and .ci/run), sourced, not run: `. scripts/lib.sh`.

# install_missing WHO PACKAGE...: installs those of the Debian PACKAGEs that are not installed
# (apt-get update, then a non-interactive install; as root, or through sudo otherwise), saying
# so on stderr as WHO. Does nothing when all are there.
install_missing() {
    _im_who=$1
    shift
    _im_need=""
    for _im_pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$_im_pkg" 2>/dev/null | grep -q "install ok installed" ||
            _im_need="$_im_need $_im_pkg"
    done
    [ -n "$_im_need" ] || return 0
    echo "$_im_who: installing$_im_need" >&2
    _im_sudo=""
    [ "$(id -u)" -eq 0 ] || _im_sudo="sudo"
    $_im_sudo apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $_im_sudo apt-get install -y -qq $_im_need >&2
}

# clang_build DIR OPTION...: a clang build directory DIR configured with the meson OPTIONs, or,
# when DIR is configured already, reconfigured (keeping the options it has).
clang_build() {
    _cb_dir=$1
    shift
    if [ -f "$_cb_dir/build.ninja" ]; then
        meson setup --reconfigure "$_cb_dir" >/dev/null
    else
        CC=clang meson setup "$_cb_dir" "$@" >/dev/null
    fi
}
