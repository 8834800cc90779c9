#!/usr/bin/env bash
# A Vulkan driver for ManiSkill/SAPIEN on a CPU-only Debian machine, without touching system Mesa.
#
# SAPIEN needs Vulkan even for state observations, and Debian 12's lavapipe (Mesa 22.3) lacks
# descriptorBindingPartiallyBound. Mesa 25 lavapipe from <codename>-backports works: we download
# mesa-vulkan-drivers and libdrm2 with a private apt config (nothing added to the system's sources),
# unpack them under $CACHE with dpkg-deb and write an ICD json pointing at the unpacked
# libvulkan_lvp.so. The archive URI is read from this machine's own apt sources.
#
# Writes $CACHE/env.sh (VK_ICD_FILENAMES, LD_LIBRARY_PATH) on success; exits 0 with a notice when
# the recipe does not apply (ManiSkill tests then skip with a reason).
set -euo pipefail

CACHE="$(realpath -m "${1:-.cache/vulkan-lvp}")"
ENV_FILE="$CACHE/env.sh"
ICD="$CACHE/lvp_icd.json"

skip() { echo "maniskill-cpu: $1; ManiSkill tests will be skipped" >&2; rm -f "$ENV_FILE"; exit 0; }

if [ -f "$ENV_FILE" ] && [ -f "$ICD" ] && [ -f "$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["ICD"]["library_path"])' "$ICD")" ]; then
    exit 0
fi
for icd in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
    [ -f "$icd" ] && skip "an NVIDIA Vulkan driver is installed (use it: no CPU driver needed)"
done
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || skip "no apt-get/dpkg-deb (not Debian)"
. /etc/os-release
CODENAME="${VERSION_CODENAME:-}"
[ -n "$CODENAME" ] || skip "unknown Debian codename"

SUDO=$( [ "$(id -u)" = 0 ] || echo sudo )
if ! ldconfig -p | grep -q 'libvulkan.so.1'; then
    echo "maniskill-cpu: installing the Vulkan loader (libvulkan1)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libvulkan1 >/dev/null
fi

# The URI (and keyring) of the source that serves "$CODENAME" itself, from one-line or deb822 sources.
read -r URI KEYRING < <(python3 - "$CODENAME" <<'EOF'
import glob, re, sys
codename = sys.argv[1]
def found(uri, signed):
    print(uri, signed or "-"); sys.exit(0)
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try: lines = open(path).read().splitlines()
    except OSError: continue
    for line in lines:
        m = re.match(r"\s*deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
        if m and m.group(3) == codename:
            s = re.search(r"signed-by=(\S+)", m.group(1) or "")
            found(m.group(2), s and s.group(1))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in open(path).read().split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line and ":" in line and not line.lstrip().startswith("#") and not line[0].isspace():
                k, v = line.split(":", 1); fields[k.strip().lower()] = v.strip()
        if "deb" in fields.get("types", "").split() and codename in fields.get("suites", "").split():
            found(fields["uris"].split()[0], fields.get("signed-by"))
print("- -")
EOF
)
[ "$URI" != "-" ] || skip "no apt source serves '$CODENAME' in /etc/apt/sources.list{,.d}"

mkdir -p "$CACHE/apt/lists/partial" "$CACHE/apt/cache/archives/partial" "$CACHE/debs"
OPTS=""
[ "$KEYRING" != "-" ] && OPTS="[signed-by=$KEYRING] "
echo "deb ${OPTS}$URI $CODENAME-backports main" > "$CACHE/apt/sources.list"
APT=(apt-get -qq -o "Dir::Etc::sourcelist=$CACHE/apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
     -o "Dir::State::Lists=$CACHE/apt/lists" -o "Dir::Cache=$CACHE/apt/cache" -o APT::Sandbox::User=root)
echo "maniskill-cpu: fetching Mesa lavapipe from $CODENAME-backports into $CACHE"
"${APT[@]}" update || skip "apt-get update of $CODENAME-backports failed"
(cd "$CACHE/debs" && "${APT[@]}" download "mesa-vulkan-drivers/$CODENAME-backports" "libdrm2/$CODENAME-backports") \
    || skip "$CODENAME-backports has no mesa-vulkan-drivers/libdrm2"
rm -rf "$CACHE/root"
for deb in "$CACHE"/debs/*.deb; do dpkg-deb -x "$deb" "$CACHE/root"; done

LIB="$(find "$CACHE/root" -name libvulkan_lvp.so | head -n1)"
SRC_ICD="$(find "$CACHE/root" -name 'lvp_icd*.json' | head -n1)"
[ -n "$LIB" ] && [ -n "$SRC_ICD" ] || skip "the unpacked package has no libvulkan_lvp.so"
python3 - "$SRC_ICD" "$LIB" "$ICD" <<'EOF'
import json, sys
icd = json.load(open(sys.argv[1]))
icd["ICD"]["library_path"] = sys.argv[2]
json.dump(icd, open(sys.argv[3], "w"), indent=2)
EOF
cat > "$ENV_FILE" <<EOF
export VK_ICD_FILENAMES="$ICD"
export LD_LIBRARY_PATH="$(dirname "$LIB")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
echo "maniskill-cpu: lavapipe ready; . $ENV_FILE to use it"
