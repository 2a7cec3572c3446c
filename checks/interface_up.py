"""Site check: the job's data-plane interface must exist, be up and have an address.

Cluster admins set the interface in DISTDOCTOR_SITE_IFACE (e.g. ib0, bond0), or in the
`required_interface` of this file's SETTINGS. Load with:

    distdoctor check --checks-dir checks/
"""

from __future__ import annotations

from distdoctor import Unknown, check, finding_kind

SETTINGS = {"required_interface": "ib0"}

IFACE_MISSING = finding_kind(
    "site.E001",
    cause="wrong_interface",
    title="The site's data-plane interface is missing",
    hint="Run on a node that has the interface, or ask the cluster admins",
)
IFACE_DOWN = finding_kind(
    "site.E002",
    cause="wrong_interface",
    title="The site's data-plane interface is down or has no address",
    hint="Bring the interface up (ip link set <if> up) or ask the cluster admins",
)
IFACE_UNKNOWN = finding_kind(
    "site.I003",
    cause="wrong_interface",
    title="Could not tell whether the site's data-plane interface is up",
    hint="Check `ip addr` on this node by hand",
)


@check(stage="local", tags=("site", "network"), emits=(IFACE_MISSING, IFACE_DOWN, IFACE_UNKNOWN))
def data_plane_interface_up(ctx):
    """The interface named by the site must exist, be up and carry an address."""
    name = ctx.env.get("DISTDOCTOR_SITE_IFACE") or SETTINGS["required_interface"]
    interfaces = ctx.probes.interfaces()
    if isinstance(interfaces, Unknown):
        yield IFACE_UNKNOWN(detail=str(interfaces), data={"interface": name})
        return
    iface = interfaces.get(name)
    if iface is None:
        present = ", ".join(sorted(interfaces)) or "none"
        yield IFACE_MISSING(
            f"Interface {name} does not exist on this node",
            detail=f"Interfaces present: {present}.",
            remediation=f"Run on a node with {name}, or set DISTDOCTOR_SITE_IFACE to the right one",
            data={"interface": name, "present": sorted(interfaces)},
        )
    elif not iface.up or not iface.addresses:
        state = "down" if not iface.up else "up but without an address"
        yield IFACE_DOWN(
            f"Interface {name} is {state}",
            remediation=f"ip link set {name} up (and give it its address), or ask the cluster admins",
            data={"interface": name, "up": iface.up, "addresses": list(iface.addresses)},
        )
