// SPDX-License-Identifier: GPL-2.0-only
/*
 * ivcuda_uio - UIO driver for the ivshmem PCI device (1af4:1110), the guest
 * end of ivcuda's shared-memory transport.
 *
 * Stock QEMU's ivshmem-doorbell raises interrupts through MSI-X only (it never
 * takes the INTx path), so uio_pci_generic cannot deliver them. This driver
 * enables MSI-X with every vector the device offers and registers one UIO
 * device per vector: UIO keeps one event counter per device, so a thread that
 * waits for vector k in read() on its own /dev/uioN is woken by vector k's
 * doorbells only.
 *
 * Every one of those UIO devices is named "ivcuda-vec<k>" and carries the
 * same two maps, so any one of them can be mmap()ed:
 *   map 0  "registers"  BAR0 (IntrMask, IntrStatus, IVPosition, Doorbell),
 *                       rounded out to whole pages because UIO maps must be
 *                       page-aligned; maps/map0/offset says where BAR0 starts
 *                       in the mapping. Uncached.
 *   map 1  "shmem"      BAR2, the shared memory. Cacheable: it is RAM on the
 *                       host, and uncached accesses would make the ring crawl.
 * An ivshmem-plain device has no MSI-X: it gets a single "ivcuda-vec0" with
 * the maps and no interrupt (read() fails with EIO).
 *
 * When a process that has one of the nodes open exits, the driver tells the
 * host (ivcudad reclaims that process's worker at once, however the process
 * ended, SIGKILL included): it writes the pid and the PID namespace into the
 * superblock's ring of exit notices and rings the host. Only a process that
 * exits counts (its files are released while it has PF_EXITING set); a
 * thread that closes a file of a live process does not. The namespace is
 * what tells two containers' processes with the same pid apart: the guest
 * library names its process the same way (the inode of /proc/self/ns/pid).
 *
 * The driver core serialises probe and remove (device_lock), each vector's
 * event counter is UIO's atomic, and an interrupt handler touches only its
 * own vector's uio_info. Exit notices take exit_lock.
 */

#include <linux/device.h>
#include <linux/interrupt.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/overflow.h>
#include <linux/io.h>
#include <linux/pci.h>
#include <linux/pid_namespace.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uio_driver.h>

#define DRIVER_NAME	"ivcuda_uio"
#define DRIVER_VERSION	"0.1"

#define IVSHMEM_REGS_BAR	0
#define IVSHMEM_SHMEM_BAR	2
#define IVSHMEM_REGS_SIZE	16	/* the registers ivcuda uses */
#define IVSHMEM_DOORBELL	12	/* BAR0 register: peer << 16 | vector */

/*
 * The superblock fields exit notices use (include/ivcuda/shm_abi.h, which
 * asserts these offsets): the host's peer id, and the ring of exited pids.
 */
#define IVCUDA_SB_MAGIC		0
#define IVCUDA_MAGIC		0x0100414455435649ULL	/* "IVCUDA" 0x00 0x01 */
#define IVCUDA_SB_ABI_MINOR	10
#define IVCUDA_SB_HOST_PEER_ID	40
#define IVCUDA_SB_EXIT_COUNT	256
#define IVCUDA_SB_EXIT_PID	264
#define IVCUDA_SB_EXIT_PIDNS	448	/* ABI minor 4 */
#define IVCUDA_EXIT_SLOTS	30
#define IVCUDA_HOST_VECTOR	0

/*
 * The doorbell register carries the vector in 16 bits, but nobody needs that
 * many: this bounds the allocation and matches QEMU's own ivshmem-server.
 */
#define IVCUDA_MAX_VECTORS	64

struct ivcuda_dev;

struct ivcuda_vec {
	struct uio_info info;
	struct ivcuda_dev *idev;
	char name[16];			/* "ivcuda-vec<k>", also the irq name */
};

struct ivcuda_dev {
	struct pci_dev *pdev;
	unsigned int nr_irqs;		/* MSI-X vectors enabled, 0 on ivshmem-plain */
	unsigned int nr_uio;		/* UIO devices: max(nr_irqs, 1) */
	void __iomem *regs;		/* BAR0, for the doorbell */
	void *sb;			/* BAR2's first page: the superblock */
	spinlock_t exit_lock;
	pid_t last_exit;		/* the process last reported (its files */
	u64 last_exit_start;		/* close one by one), and its start time */
	struct ivcuda_vec vec[];
};

/*
 * A node's file is released for the last time. If that happens because its
 * process exits, tell the host which process it was: the pid it saw from
 * getpid() and its PID namespace, as the guest library reports them.
 */
static int ivcuda_release(struct uio_info *info, struct inode *inode)
{
	struct ivcuda_vec *v = container_of(info, struct ivcuda_vec, info);
	struct ivcuda_dev *idev = v->idev;
	u64 start = current->group_leader->start_time;
	unsigned long flags;
	u32 n, peer;

	if (!(current->flags & PF_EXITING) || !idev->sb)
		return 0;
	/* Only memory that ivcudad formatted has a ring of notices. */
	if (READ_ONCE(*(u64 *)(idev->sb + IVCUDA_SB_MAGIC)) != IVCUDA_MAGIC)
		return 0;
	spin_lock_irqsave(&idev->exit_lock, flags);
	if (idev->last_exit != current->tgid || idev->last_exit_start != start) {
		idev->last_exit = current->tgid;
		idev->last_exit_start = start;
		n = READ_ONCE(*(u32 *)(idev->sb + IVCUDA_SB_EXIT_COUNT));
		WRITE_ONCE(((u32 *)(idev->sb + IVCUDA_SB_EXIT_PID))[n % IVCUDA_EXIT_SLOTS],
			   (u32)task_tgid_vnr(current));
		/* An older ivcudad keeps that part of the page zero. */
		if (READ_ONCE(*(u16 *)(idev->sb + IVCUDA_SB_ABI_MINOR)) >= 4)
			WRITE_ONCE(((u32 *)(idev->sb + IVCUDA_SB_EXIT_PIDNS))[n % IVCUDA_EXIT_SLOTS],
				   task_active_pid_ns(current)->ns.inum);
		smp_wmb();	/* the pid and namespace before the count that publishes them */
		WRITE_ONCE(*(u32 *)(idev->sb + IVCUDA_SB_EXIT_COUNT), n + 1);
		peer = READ_ONCE(*(u32 *)(idev->sb + IVCUDA_SB_HOST_PEER_ID));
		if (idev->nr_irqs && idev->regs)
			iowrite32((peer << 16) | IVCUDA_HOST_VECTOR,
				  idev->regs + IVSHMEM_DOORBELL);
	}
	spin_unlock_irqrestore(&idev->exit_lock, flags);
	return 0;
}

static irqreturn_t ivcuda_irq(int irq, void *arg)
{
	struct ivcuda_vec *v = arg;

	/* MSI-X vectors are never shared: this doorbell is ours. */
	uio_event_notify(&v->info);
	return IRQ_HANDLED;
}

static void ivcuda_fill_maps(struct pci_dev *pdev, struct uio_info *info)
{
	resource_size_t regs = pci_resource_start(pdev, IVSHMEM_REGS_BAR);
	struct uio_mem *m;

	m = &info->mem[0];
	m->name = "registers";
	m->addr = regs & PAGE_MASK;
	m->offs = regs & ~PAGE_MASK;
	m->size = PAGE_ALIGN(m->offs + pci_resource_len(pdev, IVSHMEM_REGS_BAR));
	m->memtype = UIO_MEM_PHYS;	/* UIO maps UIO_MEM_PHYS uncached */

	m = &info->mem[1];
	m->name = "shmem";
	m->addr = pci_resource_start(pdev, IVSHMEM_SHMEM_BAR);
	m->size = pci_resource_len(pdev, IVSHMEM_SHMEM_BAR);
	/*
	 * UIO_MEM_IOVA is mapped exactly like UIO_MEM_PHYS except that UIO
	 * leaves the page protection alone, which keeps this RAM cacheable.
	 */
	m->memtype = UIO_MEM_IOVA;
}

/* Registers vector k's UIO device, then its interrupt handler. */
static int ivcuda_vec_init(struct ivcuda_dev *idev, unsigned int k)
{
	struct ivcuda_vec *v = &idev->vec[k];
	struct pci_dev *pdev = idev->pdev;
	int err;

	snprintf(v->name, sizeof(v->name), "ivcuda-vec%u", k);
	v->idev = idev;
	v->info.name = v->name;
	v->info.version = DRIVER_VERSION;
	v->info.release = ivcuda_release;
	ivcuda_fill_maps(pdev, &v->info);
	v->info.irq = idev->nr_irqs ? UIO_IRQ_CUSTOM : UIO_IRQ_NONE;

	/* The handler notifies through info->uio_dev: register UIO first. */
	err = uio_register_device(&pdev->dev, &v->info);
	if (err)
		return err;
	if (!idev->nr_irqs)
		return 0;

	err = request_irq(pci_irq_vector(pdev, k), ivcuda_irq, 0, v->name, v);
	if (err) {
		uio_unregister_device(&v->info);
		return err;
	}
	return 0;
}

/* Undoes ivcuda_vec_init() for vectors n-1 down to 0. */
static void ivcuda_vecs_teardown(struct ivcuda_dev *idev, unsigned int n)
{
	while (n--) {
		if (idev->nr_irqs)
			free_irq(pci_irq_vector(idev->pdev, n), &idev->vec[n]);
		uio_unregister_device(&idev->vec[n].info);
	}
}

static int ivcuda_check_bars(struct pci_dev *pdev)
{
	if (!(pci_resource_flags(pdev, IVSHMEM_REGS_BAR) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, IVSHMEM_REGS_BAR) < IVSHMEM_REGS_SIZE) {
		dev_err(&pdev->dev, "BAR0 is not a register BAR of at least %d bytes\n",
			IVSHMEM_REGS_SIZE);
		return -ENODEV;
	}
	/* A cacheable map must not spill into a neighbour's page. */
	if (!(pci_resource_flags(pdev, IVSHMEM_SHMEM_BAR) & IORESOURCE_MEM) ||
	    !PAGE_ALIGNED(pci_resource_start(pdev, IVSHMEM_SHMEM_BAR)) ||
	    !PAGE_ALIGNED(pci_resource_len(pdev, IVSHMEM_SHMEM_BAR)) ||
	    pci_resource_len(pdev, IVSHMEM_SHMEM_BAR) == 0) {
		dev_err(&pdev->dev, "BAR2 (shared memory) is missing or not page-aligned\n");
		return -ENODEV;
	}
	return 0;
}

static int ivcuda_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct ivcuda_dev *idev;
	unsigned int nr_irqs = 0;
	unsigned int k;
	int nvec;
	int err;

	err = pci_enable_device(pdev);
	if (err) {
		dev_err(&pdev->dev, "pci_enable_device failed: %d\n", err);
		return err;
	}

	err = pci_request_regions(pdev, DRIVER_NAME);
	if (err)
		goto err_disable;

	err = ivcuda_check_bars(pdev);
	if (err)
		goto err_release;

	/* Without bus mastering the device's MSI-X writes are dropped. */
	pci_set_master(pdev);

	/* Negative when there is no MSI-X capability: ivshmem-plain. */
	nvec = pci_msix_vec_count(pdev);
	if (nvec > 0) {
		nvec = pci_alloc_irq_vectors(pdev, 1, min(nvec, IVCUDA_MAX_VECTORS),
					     PCI_IRQ_MSIX);
		if (nvec < 0) {
			err = nvec;
			dev_err(&pdev->dev, "cannot enable MSI-X: %d\n", err);
			goto err_clear_master;
		}
		nr_irqs = nvec;
	}

	idev = kzalloc(struct_size(idev, vec, max(nr_irqs, 1U)), GFP_KERNEL);
	if (!idev) {
		err = -ENOMEM;
		goto err_free_vectors;
	}
	idev->pdev = pdev;
	idev->nr_irqs = nr_irqs;
	idev->nr_uio = max(nr_irqs, 1U);
	spin_lock_init(&idev->exit_lock);
	/*
	 * Exit notices need the doorbell and the superblock. Without them the
	 * device still works; the host then reclaims a process only when it
	 * says goodbye.
	 */
	idev->regs = pci_iomap(pdev, IVSHMEM_REGS_BAR, IVSHMEM_REGS_SIZE);
	idev->sb = memremap(pci_resource_start(pdev, IVSHMEM_SHMEM_BAR), PAGE_SIZE,
			    MEMREMAP_WB);
	if (!idev->regs || !idev->sb)
		dev_warn(&pdev->dev, "no exit notices (cannot map the registers or the superblock)\n");

	for (k = 0; k < idev->nr_uio; k++) {
		err = ivcuda_vec_init(idev, k);
		if (err) {
			dev_err(&pdev->dev, "vector %u: %d\n", k, err);
			goto err_vecs;
		}
	}

	pci_set_drvdata(pdev, idev);
	dev_info(&pdev->dev, "%u MSI-X vector(s), %pa bytes of shared memory\n",
		 nr_irqs, &idev->vec[0].info.mem[1].size);
	return 0;

err_vecs:
	ivcuda_vecs_teardown(idev, k);
	if (idev->sb)
		memunmap(idev->sb);
	if (idev->regs)
		pci_iounmap(pdev, idev->regs);
	kfree(idev);
err_free_vectors:
	if (nr_irqs)
		pci_free_irq_vectors(pdev);
err_clear_master:
	pci_clear_master(pdev);
err_release:
	pci_release_regions(pdev);
err_disable:
	pci_disable_device(pdev);
	return err;
}

static void ivcuda_remove(struct pci_dev *pdev)
{
	struct ivcuda_dev *idev = pci_get_drvdata(pdev);
	unsigned int nr_irqs = idev->nr_irqs;

	/*
	 * After uio_unregister_device() UIO no longer touches our uio_info,
	 * even while user space holds the node open, so idev can go.
	 * Existing mmap()s of the BARs stay valid until unmapped: that is UIO.
	 */
	ivcuda_vecs_teardown(idev, idev->nr_uio);
	if (idev->sb)
		memunmap(idev->sb);
	if (idev->regs)
		pci_iounmap(pdev, idev->regs);
	kfree(idev);
	if (nr_irqs)
		pci_free_irq_vectors(pdev);
	pci_clear_master(pdev);
	pci_release_regions(pdev);
	pci_disable_device(pdev);
}

static const struct pci_device_id ivcuda_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },	/* Red Hat / QEMU ivshmem */
	{ 0, }
};
MODULE_DEVICE_TABLE(pci, ivcuda_ids);

static struct pci_driver ivcuda_driver = {
	.name = DRIVER_NAME,
	.id_table = ivcuda_ids,
	.probe = ivcuda_probe,
	.remove = ivcuda_remove,
};

module_pci_driver(ivcuda_driver);
MODULE_VERSION(DRIVER_VERSION);
MODULE_LICENSE("GPL v2");
MODULE_DESCRIPTION("UIO driver for ivshmem with one wait per MSI-X vector (ivcuda)");
