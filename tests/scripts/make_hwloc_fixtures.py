#!/usr/bin/env python3
"""Writes hwloc 2.x XML topologies for the placement tests (tests/data/hwloc/), in the
format `lstopo --of xml` exports: packages with one NUMA node each, cores with one PU, and
NVIDIA PCI devices (0302 [10de:2335]) behind bridges under a package (local) or directly
under the machine (no locality)."""
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hwloc")


def mask(bits):
    v = 0
    for b in bits:
        v |= 1 << b
    return "0x%08x" % v


def topology(packages, cores_per_package, gpus_by_package, machine_gpus=()):
    gp = [100]

    def nid():
        gp[0] += 1
        return gp[0]

    all_pus = list(range(packages * cores_per_package))
    nodes = list(range(packages))
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">', '<topology version="2.0">']
    lines.append(f'  <object type="Machine" os_index="0" cpuset="{mask(all_pus)}" complete_cpuset="{mask(all_pus)}" '
                 f'allowed_cpuset="{mask(all_pus)}" nodeset="{mask(nodes)}" complete_nodeset="{mask(nodes)}" '
                 f'allowed_nodeset="{mask(nodes)}" gp_index="1">')
    lines.append('    <info name="Backend" value="Synthetic"/>')

    def gpu(bus, indent):
        return [f'{indent}<object type="Bridge" gp_index="{nid()}" bridge_type="0-1" depth="0" bridge_pci="0000:[{bus}-{bus}]">',
                f'{indent}  <object type="PCIDev" gp_index="{nid()}" pci_busid="0000:{bus}:00.0" '
                f'pci_type="0302 [10de:2335] [10de:18be] a1" pci_link_speed="31.507692"/>',
                f'{indent}</object>']

    for p in range(packages):
        pus = list(range(p * cores_per_package, (p + 1) * cores_per_package))
        c, n = mask(pus), mask([p])
        lines.append(f'    <object type="Package" os_index="{p}" cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" '
                     f'complete_nodeset="{n}" gp_index="{nid()}">')
        lines.append(f'      <object type="NUMANode" os_index="{p}" cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" '
                     f'complete_nodeset="{n}" gp_index="{nid()}" local_memory="1073741824">')
        lines.append('        <page_type size="4096" count="262144"/>')
        lines.append('      </object>')
        for pu in pus:
            b = mask([pu])
            lines.append(f'      <object type="Core" os_index="{pu}" cpuset="{b}" complete_cpuset="{b}" nodeset="{n}" '
                         f'complete_nodeset="{n}" gp_index="{nid()}">')
            lines.append(f'        <object type="PU" os_index="{pu}" cpuset="{b}" complete_cpuset="{b}" nodeset="{n}" '
                         f'complete_nodeset="{n}" gp_index="{nid()}"/>')
            lines.append('      </object>')
        for bus in gpus_by_package.get(p, []):
            lines += gpu(bus, "      ")
        lines.append('    </object>')
    for bus in machine_gpus:
        lines += gpu(bus, "    ")
    lines.append('  </object>')
    lines += ['  <support name="discovery.pu"/>', '  <support name="discovery.numa"/>',
              '  <support name="discovery.numa_memory"/>', '  <support name="custom.exported_support"/>', '</topology>']
    return "\n".join(lines) + "\n"


FIXTURES = {
    # An 8-GPU server: 2 sockets of 8 cores, 4 GPUs on each (as DGX-class hosts place them); the
    # emulated build runs kvprd's placement of 8 GPU workers on it.
    "eight-gpu-two-socket.xml": topology(2, 8, {0: ["18", "2a", "3a", "5d"], 1: ["9a", "ab", "ba", "db"]}),
    # 4 GPUs on 2 sockets, 4 cores each: two workers per node, two cores each.
    "four-gpu-two-socket.xml": topology(2, 4, {0: ["17", "31"], 1: ["65", "ca"]}),
    # GPUs behind the host bridge with no NUMA locality (as many VMs report).
    "gpus-without-locality.xml": topology(2, 2, {}, machine_gpus=["3b", "5e"]),
    # 3 GPUs on 2 nodes: two share node 0 (one core each), one has node 1.
    "more-gpus-than-nodes.xml": topology(2, 2, {0: ["17", "31"], 1: ["65"]}),
    # One node, one GPU: everything is local.
    "one-node-one-gpu.xml": topology(1, 4, {}, machine_gpus=["01"]),
}

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, xml in FIXTURES.items():
        with open(os.path.join(OUT, name), "w") as f:
            f.write(xml)
        print("wrote", name)
