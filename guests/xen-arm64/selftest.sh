# In the ARM64 dom0 (run.sh KIT guests/xen-arm64/selftest.sh OUTDIR): xl info, create the
# demo unikernel domU, wait for two split lines on its vUART, xl list/vcpu-list, destroy it.
set -e
xl info | grep -E 'xen_version|nr_cpus|xen_caps|virt_caps'
domid=$(sh "$(dirname "$GLASS_SCRIPT")/demo-domu.sh" -n 2 uk)
echo "domid $domid"
xl list
xl vcpu-list
xl destroy uk
echo selftest PASS
