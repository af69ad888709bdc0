#!/usr/bin/env bash
# Regenerates nvme/src/bindings.rs from Debian libnvme-dev's <nvme/types.h>.
#
# The output is committed: CI never runs this script and never needs libclang.
# Needs: bindgen 0.60.x CLI, libclang, libnvme-dev (1.3 on Debian bookworm), rustfmt.
#
# Usage: nvme/gen-bindings.sh            (from anywhere; writes nvme/src/bindings.rs)
#
# Post-processing (see the comments at each step below):
#   1. the header's __u8/__le16/__le32/__le64 and `char` become plain u8/u16/u32/u64
#      (all multi-byte fields are little-endian on the wire; the crate only builds on
#      little-endian hosts, see lib.rs);
#   2. flexible array members (`nid[]`, `entries[]`) are dropped, so the Rust structs are
#      the fixed-size parts with the same size as C's sizeof;
#   3. the union `nvmf_tsas` is made opaque (a 256-byte blob) so that the discovery log
#      entry can derive zerocopy's IntoBytes (unions cannot, on stable zerocopy);
#   4. every generated struct derives zerocopy's FromBytes, IntoBytes, KnownLayout and
#      Immutable (the IntoBytes derive proves at compile time that there is no padding).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
header=/usr/include/nvme/types.h
out="$here/src/bindings.rs"

structs='nvme_id_ctrl|nvme_id_ns|nvme_id_psd|nvme_lbaf|nvme_ns_id_desc|nvme_smart_log|nvme_error_log_page|nvme_firmware_slot|nvme_cmd_effects_log|nvmf_disc_log_entry|nvmf_discovery_log|nvmf_connect_data'
enums='nvme_constants|nvme_csi|nvme_register_offsets|nvme_admin_opcode|nvme_io_opcode|nvme_fctype|nvme_status_field|nvme_features_id|nvme_identify_cns|nvme_cmd_get_log_lid|nvme_ns_id_desc_nidt|nvme_ns_id_desc_nidt_lens|nvmf_trtype|nvmf_addr_family|nvme_subsys_type|nvmf_treq|nvmf_tcp_sectype|nvme_ae_type|nvme_ae_info_notice|nvme_id_ctrl_sgls|nvme_id_ctrl_cmic|nvme_id_ctrl_oacs|nvme_id_ctrl_lpa|nvme_id_ctrl_oncs|nvme_id_ctrl_vwc|nvme_id_ctrl_cntrltype|nvme_id_ns_flbas|nvme_cmd_effects'

bindgen_version="$(bindgen --version | awk '{print $2}')"
libnvme_version="$(dpkg-query -W -f='${Version}' libnvme-dev 2>/dev/null || echo unknown)"
today="$(date -u +%Y-%m-%d)"

cmd=(bindgen "$header"
    --no-doc-comments
    --no-layout-tests
    --no-prepend-enum-name
    --allowlist-type "^(${structs})\$"
    --allowlist-type "^(${enums})\$"
    --constified-enum-module "^(${enums})\$"
    --opaque-type '^nvmf_tsas$'
    -- -I/usr/include)

tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
"${cmd[@]}" >"$tmp"

# Step 1: plain integer field types. The `pub type __u8 = ...` alias chain is removed.
# Step 2: drop flexible array members and bindgen's __IncompleteArrayField helper.
# Step 4: zerocopy derives on every struct.
python3 - "$tmp" <<'PY'
import re, sys
path = sys.argv[1]
src = open(path).read()

# Remove the helper type for flexible array members and its impls.
src = re.sub(r'#\[repr\(C\)\]\n#\[derive\(Default\)\]\npub struct __IncompleteArrayField<T>.*?\n}\n', '', src, flags=re.S)
src = re.sub(r'impl<T> __IncompleteArrayField<T> \{.*?\n}\n', '', src, flags=re.S)
src = re.sub(r'impl<T> ::std::fmt::Debug for __IncompleteArrayField<T> \{.*?\n}\n', '', src, flags=re.S)
src = re.sub(r'\n\s*pub \w+: __IncompleteArrayField<[^>]*>,', '', src)
assert '__IncompleteArrayField' not in src, 'flexible array member left over'

# Plain integers instead of the header's typedef chain.
src = re.sub(r'pub type __(u8|u16|u32|u64|le16|le32|le64|s8|s16|s32|s64|be16|be32|be64) = [^;]*;\n', '', src)
for c, r in (('__le16', 'u16'), ('__le32', 'u32'), ('__le64', 'u64'),
             ('__u8', 'u8'), ('__u16', 'u16'), ('__u32', 'u32'), ('__u64', 'u64')):
    src = re.sub(r'\b' + c + r'\b', r, src)
src = src.replace('::std::os::raw::c_char', 'u8')
src = src.replace('::std::os::raw::c_uint', 'u32')
src = src.replace('::std::os::raw::c_int', 'i32')
src = src.replace('::std::os::raw::c_ushort', 'u16')
src = src.replace('::std::os::raw::c_uchar', 'u8')
src = src.replace('::std::os::raw::c_ulonglong', 'u64')
assert '__le' not in src and '__u' not in src, 'kernel typedef left over'

# Step 3: the opaque union nvmf_tsas becomes a struct holding the same 256-byte blob
# (zerocopy cannot derive IntoBytes for unions on stable).
src, n = re.subn(r'pub union nvmf_tsas \{', 'pub struct nvmf_tsas {', src)
assert n == 1, 'nvmf_tsas union not found'

# Step 4: one uniform derive list on every struct: bindgen's own derives are dropped
# (it omits them where a union or flexible array member was involved) and replaced.
src = re.sub(r'(#\[repr\(C[^\]]*\)\]\n(?:#\[repr\(align\(\d+\)\)\]\n)?)#\[derive\([^\]]*\)\]\n(pub struct )',
             r'\1\2', src)
derive = ('#[derive(Debug, Copy, Clone, zerocopy::FromBytes, zerocopy::IntoBytes, '
          'zerocopy::KnownLayout, zerocopy::Immutable)]\n')
src, n = re.subn(r'(#\[repr\(C[^\]]*\)\]\n(?:#\[repr\(align\(\d+\)\)\]\n)?)(pub struct )',
                 lambda m: m.group(1) + derive + m.group(2), src)
assert n >= 12, f'expected >= 12 structs, patched {n}'
assert 'pub union' not in src, 'union left over'
open(path, 'w').write(src)
PY

{
    echo "// @generated by nvme/gen-bindings.sh -- do not edit by hand; rerun the script."
    echo "//"
    echo "// Source:   ${header} from Debian libnvme-dev ${libnvme_version}"
    echo "// bindgen:  ${bindgen_version}"
    echo "// Date:     ${today}"
    echo "// Command:  $(printf "%q " "${cmd[@]}")"
    echo "// Then post-processed by the script: plain integer field types (u8/u16/u32/u64 for"
    echo "// __u8/__le16/__le32/__le64 and u8 for char), flexible array members removed,"
    echo "// nvmf_tsas opaque, zerocopy derives on every struct."
    echo "//"
    echo "// All multi-byte fields are little-endian on the wire: write them with .to_le() and read"
    echo "// them with from_le() (both no-ops on the little-endian hosts this crate supports)."
    echo
    echo "#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, missing_docs)]"
    echo "#![allow(dead_code, clippy::all)]"
    echo
    cat "$tmp"
} >"$out"
rustfmt --edition 2024 "$out"
echo "wrote $out"
