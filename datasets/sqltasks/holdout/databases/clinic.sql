-- A small veterinary clinic: owners bring their pets to appointments with vets; each
-- appointment may end with one or more treatments billed to the owner.
CREATE TABLE Owners (OwnerId INTEGER PRIMARY KEY, OwnerName VARCHAR NOT NULL, City VARCHAR NOT NULL, Phone VARCHAR NOT NULL);
CREATE TABLE Pets (PetId INTEGER PRIMARY KEY, OwnerId INTEGER NOT NULL REFERENCES Owners(OwnerId), PetName VARCHAR NOT NULL, Species VARCHAR NOT NULL, BirthYear INTEGER NOT NULL);
CREATE TABLE Vets (VetId INTEGER PRIMARY KEY, VetName VARCHAR NOT NULL, Specialty VARCHAR NOT NULL);
CREATE TABLE Appointments (AppointmentId INTEGER PRIMARY KEY, PetId INTEGER NOT NULL REFERENCES Pets(PetId), VetId INTEGER NOT NULL REFERENCES Vets(VetId), VisitDate DATE NOT NULL, Reason VARCHAR NOT NULL, Cancelled BOOLEAN NOT NULL);
CREATE TABLE Treatments (TreatmentId INTEGER PRIMARY KEY, AppointmentId INTEGER NOT NULL REFERENCES Appointments(AppointmentId), Description VARCHAR NOT NULL, Cost DECIMAL(8,2) NOT NULL);
INSERT INTO Owners VALUES
  (1, 'Nadia Rahman', 'Leeds', '0113 555 0101'),
  (2, 'Peter Walsh', 'York', '01904 555 0102'),
  (3, 'Sofia Greco', 'Leeds', '0113 555 0103'),
  (4, 'Tunde Bello', 'Harrogate', '01423 555 0104'),
  (5, 'Wen Li', 'York', '01904 555 0105');
INSERT INTO Pets VALUES
  (1, 1, 'Biscuit', 'dog', 2017),
  (2, 1, 'Miso', 'cat', 2020),
  (3, 2, 'Rufus', 'dog', 2012),
  (4, 3, 'Pepper', 'rabbit', 2021),
  (5, 3, 'Luna', 'cat', 2015),
  (6, 4, 'Kiwi', 'parrot', 2010),
  (7, 5, 'Bao', 'dog', 2022),
  (8, 5, 'Tofu', 'cat', 2019),
  (9, 2, 'Juno', 'tortoise', 2005);
INSERT INTO Vets VALUES
  (1, 'Dr. Hannah Price', 'general'),
  (2, 'Dr. Arjun Mehta', 'surgery'),
  (3, 'Dr. Clara Jensen', 'exotics');
INSERT INTO Appointments VALUES
  (1, 1, 1, DATE '2024-03-04', 'vaccination', FALSE),
  (2, 2, 1, DATE '2024-03-04', 'check-up', FALSE),
  (3, 3, 2, DATE '2024-03-11', 'lump removal', FALSE),
  (4, 4, 3, DATE '2024-03-12', 'dental', FALSE),
  (5, 5, 1, DATE '2024-03-18', 'check-up', TRUE),
  (6, 6, 3, DATE '2024-03-20', 'wing injury', FALSE),
  (7, 7, 1, DATE '2024-04-02', 'vaccination', FALSE),
  (8, 3, 2, DATE '2024-04-08', 'stitches out', FALSE),
  (9, 8, 1, DATE '2024-04-09', 'check-up', FALSE),
  (10, 1, 2, DATE '2024-04-15', 'x-ray', FALSE),
  (11, 7, 1, DATE '2024-04-22', 'check-up', TRUE);
INSERT INTO Treatments VALUES
  (1, 1, 'rabies vaccine', 45.00),
  (2, 2, 'examination', 35.00),
  (3, 3, 'surgery', 420.00),
  (4, 3, 'pain relief', 28.50),
  (5, 4, 'tooth trim', 60.00),
  (6, 6, 'splint', 75.00),
  (7, 6, 'antibiotics', 22.00),
  (8, 7, 'booster vaccine', 40.00),
  (9, 8, 'suture removal', 30.00),
  (10, 9, 'examination', 35.00),
  (11, 10, 'x-ray', 110.00);
